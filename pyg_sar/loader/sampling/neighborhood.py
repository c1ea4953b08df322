"""A neighborhood grown hop by hop and shared by all seeds of a batch, as
PyG's ``NeighborLoader`` grows it (:func:`grow`): at every hop, for every
edge type ``(src, rel, dst)`` in the graph's order, each ``dst`` node that
was new in the previous hop gets its sampled in-edges of that type, and the
sources not in the batch yet become the ``src`` nodes of this hop, in order
of first appearance. A homogeneous graph is the one-type case
(:data:`~pyg_sar.loader.shards.base.NODE`,
:data:`~pyg_sar.loader.shards.base.EDGE`).

Batch-local ids come from a map over all global ids of a type
(:class:`BatchIds`), so relabeling a batch costs O(batch), not a sort.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

_INT32_MAX = torch.iinfo(torch.int32).max

EdgeType = Tuple[str, str, str]
# One hop of every edge type: frontier ids per node type (and their seeds'
# times, or None) -> (target, source, edge id, count per frontier entry)
# per edge type, as pyg_sar.loader.sampling.exchange.exchange_hop returns.
Hop = Callable[[Dict[str, Tensor], int, Optional[Dict[str, Tensor]]],
               Dict[EdgeType, Tuple[Tensor, Tensor, Tensor, Tensor]]]


class BatchIds:
    """Global id -> batch-local id of the batch being built, for the nodes
    of one type: ``index`` over all their global ids (``-1``: not in the
    batch, which it is again between batches) and a scratch map of the same
    size for :meth:`add`. 8 bytes per node."""

    def __init__(self, num_nodes: int) -> None:
        self.index = torch.full((num_nodes, ), -1, dtype=torch.int32)
        self._first_position = torch.full((num_nodes, ), _INT32_MAX,
                                          dtype=torch.int32)
        self.parts: List[Tensor] = []
        self.count = 0

    def put(self, ids: Tensor, repeats: bool = False) -> None:
        """Numbers the ``ids`` (none in the batch yet) next, distinct
        unless ``repeats`` (a batch's seeds: every occurrence gets its own
        row, an id maps to its first, as PyG's samplers map it)."""
        rows = torch.arange(self.count, self.count + ids.numel(),
                            dtype=torch.int32)
        if repeats:
            self.index[ids] = _INT32_MAX
            self.index.scatter_reduce_(0, ids, rows, reduce='amin')
        else:
            self.index[ids] = rows
        self.count += ids.numel()
        self.parts.append(ids)

    def add(self, ids: Tensor) -> Tensor:
        """Numbers the ``ids`` not in the batch yet next, in order of first
        appearance (the order in which PyG's sampler adds new nodes), and
        returns them."""
        fresh = first_seen_absent(ids, self.index, self._first_position)
        self.put(fresh)
        return fresh

    def local(self, ids: Tensor) -> Tensor:
        """The batch-local ids of ``ids`` (all in the batch)."""
        return self.index[ids].long()

    def release(self) -> Tensor:
        """The batch's global ids in batch order; the map is left clean for
        the next batch."""
        for ids in self.parts:
            self.index[ids] = -1
        n_id = torch.cat(self.parts) if self.parts else \
            torch.empty(0, dtype=torch.long)
        self.parts, self.count = [], 0
        return n_id


def first_seen_absent(ids: Tensor, index: Tensor,
                      first_position: Tensor) -> Tensor:
    """The distinct ``ids`` with ``index[id] < 0``, in order of first
    appearance.

    ``first_position`` is a scratch map over all global ids holding
    ``INT32_MAX``; it is used, and restored, here so that the answer costs
    O(len(ids)) instead of a sort."""
    candidates = ids[index[ids] < 0]
    if candidates.numel() == 0:
        return candidates
    position = torch.arange(candidates.numel(), dtype=torch.int32)
    first_position.scatter_reduce_(0, candidates, position, reduce='amin')
    is_first = first_position[candidates] == position
    first_position[candidates] = _INT32_MAX
    return candidates[is_first]


def grow(seeds: Dict[str, Tensor], ids: Dict[str, BatchIds],
         edge_types: Sequence[EdgeType], num_hops: int, hop: Hop):
    """Samples the neighborhoods of the ``seeds`` of one or more node types
    over ``num_hops`` hops (``hop``: one collective hop), with the
    batch-local ids of ``ids`` (one per node type, clean; clean again on
    return). As in PyG, a repeated seed is a row of its own, sampled
    independently in the first hop. Returns ``(n_id, edge_index, e_id,
    num_sampled_nodes, num_sampled_edges)`` per type."""
    empty = torch.empty(0, dtype=torch.long)
    node_types = list(ids)
    for t, t_seeds in seeds.items():
        ids[t].put(t_seeds, repeats=True)
    num_sampled_nodes = {t: [ids[t].count] for t in node_types}
    # The batch-local id of every hop's first target, per type: targets are
    # rows by position (a repeated seed's edges go to its own row).
    start = {t: 0 for t in node_types}
    num_sampled_edges: Dict[EdgeType, List[int]] = {e: [] for e in
                                                    edge_types}
    rows: Dict[EdgeType, List[Tensor]] = {e: [] for e in edge_types}
    cols: Dict[EdgeType, List[Tensor]] = {e: [] for e in edge_types}
    e_ids: Dict[EdgeType, List[Tensor]] = {e: [] for e in edge_types}
    frontier = {t: seeds.get(t, empty) for t in node_types}
    try:
        for h in range(num_hops):
            sampled = hop(frontier, h, None)
            new: Dict[str, List[Tensor]] = {t: [] for t in node_types}
            for e in edge_types:
                src, _, dst = e
                targets, sources, edge_ids, counts = sampled[e]
                new[src].append(ids[src].add(sources))
                rows[e].append(ids[src].local(sources))
                cols[e].append(start[dst] + torch.repeat_interleave(
                    counts, output_size=targets.numel()))
                e_ids[e].append(edge_ids)
                num_sampled_edges[e].append(edge_ids.numel())
            for t in node_types:
                start[t] += frontier[t].numel()
                frontier[t] = torch.cat(new[t]) if new[t] else empty
                num_sampled_nodes[t].append(frontier[t].numel())
    finally:
        n_id = {t: ids[t].release() for t in node_types}
    edge_index = {e: torch.stack([torch.cat(rows[e]), torch.cat(cols[e])])
                  if rows[e] else torch.empty(2, 0, dtype=torch.long)
                  for e in edge_types}
    e_id = {e: torch.cat(e_ids[e]) if e_ids[e] else empty
            for e in edge_types}
    return n_id, edge_index, e_id, num_sampled_nodes, num_sampled_edges
