"""The local edges a stock layer's ``forward`` runs over, shared by the
hand-written adapters of :mod:`pyg_sar.nn.conv` (``EGConv``, ``PDNConv``,
``WLConv``, ``SuperGATConv``): the graph to run on (the graph itself, or its
:meth:`~pyg_sar.DistGraph.reverse` for ``flow='target_to_source'``), its
``local + halo`` edge index, per-edge tensors moved into that edge order,
and the node count PyG infers from an ``edge_index``."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.graph import DistGraph
from pyg_sar.nn.neighborhood import log_once, pull_edge_tensors


def run_edges(module, graph: DistGraph, edge_value: Optional[Tensor] = None,
              device=None) -> Tuple[DistGraph, Tensor, Optional[Tensor]]:
    """``(run_graph, edge_index, edge_value)``: the aggregation side of
    ``edge_index`` is local, the other side indexes
    :meth:`DistGraph.fetch_halo` rows of ``run_graph``; ``edge_value`` (in
    the graph's edge order) is moved into the order of ``edge_index``."""
    name = type(module).__name__
    if graph.is_bipartite:
        raise ValueError(f"{name} over a bipartite relation graph (source and "
                         f"destination types differ) is not supported")
    log_once(module, 'a stock PyG layer')
    if module.flow == 'source_to_target':
        run, ei = graph, graph.halo_edge_index()
    else:
        run = graph.reverse()
        ei = run.halo_edge_index().flip(0)
        if edge_value is not None:
            edge_value = pull_edge_tensors(module, graph, run,
                                           {'v': edge_value})['v']
    if device is not None:
        ei = ei.to(device)
    return run, ei, edge_value


def inferred_num_nodes(graph: DistGraph, edge_index: Tensor) -> int:
    """PyG's ``maybe_num_nodes(edge_index)`` of the whole graph (largest
    input-graph id on any edge, plus one), collective: layers that call
    ``add_remaining_self_loops(edge_index)`` without ``num_nodes`` give no
    self loop to the nodes above it."""
    ids = graph.orig_ids
    if ids is None:
        ids = torch.arange(graph.node_offset,
                           graph.node_offset + graph.num_nodes)
    ext = graph.fetch_halo(ids.to(torch.float64).to(edge_index.device))
    top = ext[edge_index.reshape(-1)].max() if edge_index.numel() else \
        ext.new_tensor(-1.)
    return int(comm.all_reduce(top.detach().clone().view(1), 'max')) + 1
