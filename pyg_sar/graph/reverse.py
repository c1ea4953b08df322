"""The transposed :class:`~pyg_sar.DistGraph`, for ``flow='target_to_source'``.

A worker stores the in-edges of its nodes. Aggregating at ``edge_index[0]``
needs the out-edges instead: every worker sends each of its edges ``s -> d``
to the owner of ``s``, which keeps it as the in-edge ``d -> s`` of the
transposed graph. The transposed graph is a ``DistGraph`` like any other
(blocks, halo, plan); its edges also remember where they came from, so that
per-edge tensors given in the base graph's edge order can be pulled into the
transposed order, differentiably (:meth:`ReversedGraph.pull_edge_values`).
"""
from __future__ import annotations

from typing import Dict

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.graph.exchange import RowPlan, fetch_rows
from pyg_sar.graph.dist_graph import DistGraph


class ReversedGraph(DistGraph):
    """A :class:`DistGraph` of the transposed edges (see module docs).

    Attributes:
        edge_plan: Moves per-edge rows from the base graph's edge order
            (on the worker that stores the base edge) to this graph's edge
            order (on the worker that owns the base edge's source).
    """

    def pull_edge_values(self, values: Tensor) -> Tensor:
        """Rows of a base-order per-edge tensor in this graph's edge order.
        Differentiable; collective."""
        return fetch_rows(self.edge_plan, values)

    def reverse(self) -> DistGraph:
        return self.base

    def _moved_with(self, base: DistGraph, device) -> 'ReversedGraph':
        """This graph on ``device``, as the transpose of the moved ``base``."""
        DistGraph.to(self, device)
        self.base = base

        def move(t: Tensor) -> Tensor:
            return t.to(device)

        plan = self.edge_plan
        self.edge_plan = RowPlan(
            plan.num_out, move(plan.local_src), move(plan.local_dst),
            {q: move(t) for q, t in plan.send_idx.items()},
            {q: move(t) for q, t in plan.recv_pos.items()})
        return self

    def to(self, device) -> DistGraph:
        """Moves the base graph (and with it this one) to ``device``."""
        self.base.to(device)
        return self


def reverse_graph(graph: DistGraph) -> ReversedGraph:
    """Builds the transposed graph of ``graph`` (collective)."""
    P, p = graph.world_size, graph.rank
    src, dst = graph._src_global, graph.edge_dst()
    owner = torch.searchsorted(graph.node_ptr, src, right=True) - 1
    dev = graph.device
    pos = torch.arange(graph.num_edges, device=dev)
    # What goes to each owner of a source: (its local id there, my global
    # destination id, my edge position).
    by_owner = torch.argsort(owner, stable=True)
    counts = torch.bincount(owner, minlength=P).tolist()
    outgoing, sent_pos, start = [], {}, 0
    for q in range(P):
        sel = by_owner[start:start + counts[q]]
        start += counts[q]
        outgoing.append(torch.stack([src[sel] - graph.node_ptr[q],
                                     dst[sel] + graph.node_offset,
                                     pos[sel]], dim=1))
        sent_pos[q] = pos[sel]
    incoming = comm.all_to_all_v(outgoing)
    rows = torch.cat(incoming)
    new_dst, new_src = rows[:, 0], rows[:, 1]
    # CSC order of the transposed graph: by destination, then source.
    order = torch.argsort(new_dst * graph.num_global_nodes + new_src,
                          stable=True)
    csc_ptr = torch.zeros(graph.num_nodes + 1, dtype=torch.long, device=dev)
    csc_ptr[1:] = torch.bincount(new_dst, minlength=graph.num_nodes).cumsum(0)
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel(), device=dev)

    rev = object.__new__(ReversedGraph)
    rev.mode, rev.chunk_size = graph.mode, graph.chunk_size
    rev.rank, rev.world_size = p, P
    rev.base = graph
    rev.orig_ids = getattr(graph, 'orig_ids', None)
    rev._setup(graph.node_ptr, graph.num_nodes, graph.num_global_nodes,
               csc_ptr, new_src[order], pos.new_empty(0))
    recv_pos: Dict[int, Tensor] = {}
    start = 0
    for q, t in enumerate(incoming):
        recv_pos[q] = position[start:start + t.shape[0]]
        start += t.shape[0]
    local_src, local_dst = sent_pos[p], recv_pos.pop(p)
    rev.edge_plan = RowPlan(
        rev.num_edges, local_src, local_dst,
        {q: sent_pos[q] for q in range(P) if q != p and sent_pos[q].numel()},
        {q: v for q, v in recv_pos.items() if v.numel()})
    return rev

