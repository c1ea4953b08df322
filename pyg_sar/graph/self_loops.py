"""The self-loop view of a :class:`~pyg_sar.DistGraph` (PyG's layout after
``add_self_loops``): what ``GCNConv`` and ``GATConv`` aggregate over."""
from __future__ import annotations

import torch


def make_loop_view(graph):
    """A view of ``graph`` whose local block has every existing self loop
    removed and exactly one self loop per node appended (see
    :meth:`pyg_sar.DistGraph.with_self_loops`)."""
    view = graph.shallow_view()
    src_local, dst, pos = (t.long() for t in graph._block_edges[graph.rank])
    is_loop = src_local == dst
    dev = graph.device
    # Only edge attributes need the view-to-base map (kept_base_edges),
    # which is one int64 per edge: the view keeps the few dropped loops.
    view.dropped_loops = pos[is_loop]
    view.num_base_edges = graph.num_edges
    kept = _positions_kept(graph.num_edges, view.dropped_loops, dev)
    # Positions in the view: kept base edges first, then N loops.
    new_pos_of_base = torch.full((graph.num_edges, ), -1, dtype=torch.long,
                                 device=dev)
    new_pos_of_base[kept] = torch.arange(kept.numel(), device=dev)
    loop_source = new_pos_of_base.new_full((graph.num_nodes, ), -1)
    # For duplicated loops PyG keeps the last one; so does this scatter.
    loop_source[dst[is_loop]] = pos[is_loop]
    view.loop_source_pos = loop_source
    view.num_edges = int(kept.numel()) + graph.num_nodes
    view.in_degree = graph.in_degree - torch.bincount(
        dst[is_loop], minlength=graph.num_nodes) + 1
    nodes = torch.arange(graph.num_nodes, device=dev)
    loop_pos = kept.numel() + nodes
    l_src = torch.cat([src_local[~is_loop], nodes])
    l_dst = torch.cat([dst[~is_loop], nodes])
    l_pos = torch.cat([new_pos_of_base[pos[~is_loop]], loop_pos])
    order = torch.argsort(l_dst, stable=True)
    view._block_edges = dict(graph._block_edges)
    view._block_edges[graph.rank] = (l_src[order], l_dst[order],
                                     l_pos[order])
    for q, (src, d, pos_q) in graph._block_edges.items():
        if q != graph.rank:
            view._block_edges[q] = (src, d, new_pos_of_base[pos_q.long()])
    view._make_blocks()
    return view


def kept_base_edges(view) -> torch.Tensor:
    """The base position of every view edge that is not an added loop, in
    view order (the view lists the base edges without self loops first, in
    base order). Built on first use and cached in ``view.derived``: only
    edge attributes need it."""
    if 'kept_base_edges' not in view.derived:
        view.derived['kept_base_edges'] = _positions_kept(
            view.num_base_edges, view.dropped_loops, view.device)
    return view.derived['kept_base_edges']


def _positions_kept(num_edges: int, dropped: torch.Tensor,
                    device) -> torch.Tensor:
    """``0 .. num_edges - 1`` without the positions ``dropped``, in order."""
    keep = torch.ones(num_edges, dtype=torch.bool, device=device)
    keep[dropped] = False
    return keep.nonzero().view(-1)
