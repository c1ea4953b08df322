"""All relations of a
:class:`~pyg_sar.graph.hetero_graph.HeteroDistGraph` as one bipartite :class:`~pyg_sar.DistGraph`: what layers that normalize over every
in-edge of a node across relations (``HGTConv``'s softmax) aggregate over.

The merged graph's destinations are the local nodes of every node type,
concatenated in a given type order; its sources are, for every relation in
order, the source-type nodes (PyG's ``construct_bipartite_edge_index``
layout, which ``HGTConv`` uses on one machine). Both id spaces are laid out
so that every rank owns one contiguous range (its rows of each type, or of
each relation, one after the other), which makes the merged graph an
ordinary partitioned graph with its own exchange plan.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch
from torch import Tensor

from pyg_sar.graph.dist_graph import DistGraph

EdgeType = Tuple[str, str, str]


def _counts(ptr: Tensor) -> Tensor:
    return ptr[1:] - ptr[:-1]


def _layout(ptrs: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
    """For id spaces partitioned by ``ptrs`` (one per segment), the merged
    pointer (rank ``q`` owns its rows of every segment in turn) and
    ``base[q, k]``: the merged id of rank ``q``'s first row of segment
    ``k``."""
    counts = torch.stack([_counts(p) for p in ptrs], dim=1)  # [P, K]
    per_rank = counts.sum(dim=1)
    merged_ptr = torch.zeros(counts.shape[0] + 1, dtype=torch.long,
                             device=counts.device)
    merged_ptr[1:] = per_rank.cumsum(0)
    within = counts.cumsum(dim=1) - counts
    return merged_ptr, merged_ptr[:-1, None] + within


def _to_merged(ids: Tensor, ptr: Tensor, base: Tensor) -> Tensor:
    """Merged ids of global ``ids`` of one segment (``base``: its column)."""
    owner = torch.searchsorted(ptr, ids, right=True) - 1
    return base[owner] + ids - ptr[owner]


def merge_relations(graph, node_types: List[str],
                    edge_types: List[EdgeType]) -> Tuple[DistGraph, Tensor,
                                                         Dict[str, int]]:
    """The merged graph of ``edge_types`` into ``node_types`` (collective:
    every rank must call it with the same lists), the relation index of
    each of its edges (position in ``edge_types``), in its edge order, and
    the first local row of every node type."""
    device = graph.device
    P = graph.world_size
    dst_ptrs = [graph.node_ptr_dict[t] for t in node_types]
    src_ptrs = [graph.node_ptr_dict[e[0]] for e in edge_types]
    dst_ptr, dst_base = _layout(dst_ptrs)
    src_ptr, src_base = _layout(src_ptrs)
    rank = graph.rank
    local_row = {t: int(dst_base[rank, i] - dst_ptr[rank])
                 for i, t in enumerate(node_types)}
    dsts, srcs, rels = [], [], []
    for r, edge_type in enumerate(edge_types):
        if edge_type[2] not in local_row:
            raise ValueError(f"edge type {edge_type} points into node type "
                             f"{edge_type[2]!r}, which is not among the "
                             f"node types {node_types}")
        rel = graph[edge_type]
        dsts.append(rel.edge_dst() + local_row[edge_type[2]])
        srcs.append(_to_merged(rel._src_global, src_ptrs[r],
                               src_base[:, r]))
        rels.append(torch.full((rel.num_edges, ), r, dtype=torch.long,
                               device=device))
    if dsts:
        dst, src, rel_of_edge = torch.cat(dsts), torch.cat(srcs), \
            torch.cat(rels)
    else:
        dst = src = rel_of_edge = torch.zeros(0, dtype=torch.long,
                                              device=device)
    order = torch.argsort(dst, stable=True)
    num_local = int(dst_ptr[rank + 1] - dst_ptr[rank])
    csc_ptr = torch.zeros(num_local + 1, dtype=torch.long, device=device)
    csc_ptr[1:] = torch.bincount(dst[order], minlength=num_local).cumsum(0)
    merged = DistGraph.relation(
        rank, P, graph.mode, graph.chunk_size, dst_ptr, src_ptr, csc_ptr,
        src[order], torch.arange(order.numel(), device=device))
    return merged, rel_of_edge[order], local_row
