"""The relation-expanded view of a :class:`~pyg_sar.DistGraph`: what
relational layers (``RGCNConv``, ``FastRGCNConv``) aggregate over.

Every local destination ``i`` becomes ``num_relations`` rows
``i * R + r``, and every edge of relation ``r`` points at row
``dst * R + r``. One propagation over the view then gives the aggregation
per node *and* relation (a mean divides by the in-degree per relation), with
one halo exchange for all relations; the view shares the graph's exchange
plan and edge order (``edge_*`` tensors stay in the graph's edge order).
"""
from __future__ import annotations

import torch
from torch import Tensor


def relation_view(graph, edge_type: Tensor, num_relations: int,
                  owner: str = 'relation_view'):
    """The view of ``graph`` with destinations expanded by the relation
    ``edge_type`` (one per edge, in graph edge order, values in
    ``[0, num_relations)``). Local: no communication. Cached per
    ``edge_type`` tensor (as long as it is not modified in place)."""
    _check_edge_type(graph, edge_type, num_relations, owner)
    cache = graph.derived.setdefault('relation_views', {})
    key = (edge_type.data_ptr(), edge_type._version, edge_type.numel(),
           num_relations, str(edge_type.device))
    if key not in cache:
        # The entry keeps edge_type alive, so its address is not reused.
        cache.clear()
        cache[key] = (edge_type, _make_view(graph, edge_type.to(torch.long),
                                            num_relations))
    return cache[key][1]


def _check_edge_type(graph, edge_type, num_relations: int,
                     owner: str) -> None:
    if not isinstance(edge_type, Tensor) or edge_type.dim() != 1 or \
            edge_type.is_floating_point() or edge_type.is_complex():
        raise ValueError(f"{owner}: edge_type must be a 1-D integer tensor "
                         f"with one relation per edge (got "
                         f"{_describe(edge_type)})")
    if edge_type.numel() != graph.num_edges:
        raise ValueError(f"{owner}: edge_type has {edge_type.numel()} "
                         f"entries but the graph has {graph.num_edges} "
                         f"local edges; pass the relation of every edge in "
                         f"the graph's edge order (e.g. part.edge_type)")
    if edge_type.device != graph.device:
        raise ValueError(f"{owner}: edge_type is on {edge_type.device} but "
                         f"the DistGraph is on {graph.device}")
    if edge_type.numel() and (int(edge_type.min()) < 0 or
                              int(edge_type.max()) >= num_relations):
        raise ValueError(f"{owner}: edge_type values must lie in [0, "
                         f"{num_relations}) (num_relations={num_relations}); "
                         f"got values in [{int(edge_type.min())}, "
                         f"{int(edge_type.max())}]")
    if getattr(graph, 'is_bipartite', False):
        raise ValueError(f"{owner}: relational layers run on a homogeneous "
                         f"graph (partition HeteroData.to_homogeneous()), "
                         f"not on a bipartite relation graph")


def _describe(value) -> str:
    if isinstance(value, Tensor):
        return f"a {value.dim()}-D {value.dtype} tensor"
    return type(value).__name__


def _make_view(graph, edge_type: Tensor, num_relations: int):
    R = num_relations
    view = graph.shallow_view()
    view.num_nodes = graph.num_nodes * R
    view.relation_expansion = R
    dst = graph.edge_dst() * R + edge_type
    view.in_degree = torch.bincount(dst, minlength=view.num_nodes)
    view._csc_degree = None  # edge_dst() has no meaning on the view
    view._block_edges = {}
    for q, (src, d, pos) in graph._block_edges.items():
        expanded = d.long() * R + edge_type[pos]  # no int32 overflow
        order = torch.argsort(expanded, stable=True)
        view._block_edges[q] = (src[order], expanded[order], pos[order])
    view._make_blocks()
    return view
