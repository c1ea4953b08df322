"""The collective hop: every rank sends its frontier to the owners of its
nodes, every owner samples the requests of all ranks at once and answers,
and the answers come back in frontier order (:func:`exchange_hop`).

A hop serves several frontiers together, one per edge type (the frontier of
an edge type is the frontier of its destination type; a homogeneous graph
has one), in two or three ``all_to_all`` exchanges whatever their number:
the requests (with the seeds' times, for temporal sampling), then the
answers. Messages: a request to rank ``q`` is ``[number of ids of every
frontier | the ids, frontier by frontier]``; an answer is ``[counts |
sources | edge ids]`` per frontier. Nothing is sorted: entries are grouped
by owner with one linear pass per rank and moved back by slot. What an
owner answers comes from the sampling kernels (:func:`answer`).
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.loader.sampling.kernel import ranges, sample_neighbors
from pyg_sar.loader.sampling.temporal import sample_temporal

# What an owner answers for the ids of one frontier asked by all ranks:
# (edge count of every id, source ids, edge ids), grouped by id in order.
Answer = Tuple[Tensor, Tensor, Tensor]
# One frontier after the hop: (target, source, edge id) of every sampled
# edge, grouped by target in frontier order, and the count of every entry.
Sampled = Tuple[Tensor, Tensor, Tensor, Tensor]


def group_by_owner(owner: Tensor, world_size: int) -> Tuple[Tensor,
                                                             List[int]]:
    """A stable permutation grouping entries by owner, and the group sizes;
    one linear pass per rank rather than a sort (world sizes are small)."""
    if world_size == 1:
        return torch.arange(owner.numel()), [owner.numel()]
    groups = [(owner == q).nonzero().view(-1) for q in range(world_size)]
    return torch.cat(groups), [g.numel() for g in groups]


def exchange_hop(frontiers: Sequence[Tensor], owners: Sequence[Tensor],
                 serve: Callable[[int, Tensor, Optional[Tensor]], Answer],
                 rank: int, world_size: int,
                 times: Optional[Sequence[Tensor]] = None) -> List[Sampled]:
    """Samples one hop of every frontier (collective: every rank passes as
    many frontiers, possibly empty, in the same order).

    ``owners[i]`` is the owner of every entry of ``frontiers[i]``;
    ``serve(i, ids, ids_times)`` answers on the owner for the ids of
    frontier ``i`` that every rank asked (``ids_times``: their seeds'
    times, with ``times``, one tensor per frontier). Repeated ids are
    sampled independently. Returns, per frontier, ``(target, source, edge
    id)`` of the sampled edges, grouped by target in frontier order, and
    the number of edges of every frontier entry."""
    empty = torch.empty(0, dtype=torch.long)
    groups = []
    for targets, owner in zip(frontiers, owners):
        order, counts = group_by_owner(owner, world_size)
        groups.append((targets[order], order, counts))
    # One request per peer: [count of every frontier | ids, frontier by
    # frontier].
    received = comm.all_to_all_v([torch.cat(
        [torch.tensor([c[q] for _, _, c in groups], dtype=torch.long)] +
        [ids.split(c)[q] for ids, _, c in groups])
        for q in range(world_size)])
    received_times = None
    if times is not None:  # every request carries its seed's time
        received_times = comm.all_to_all_v([torch.cat(
            [t[order].split(c)[q] for t, (_, order, c) in zip(times, groups)])
            for q in range(world_size)])
        time_offsets = [0] * world_size

    # Serve: per frontier, every peer's requests in one call.
    replies: List[List[Tensor]] = [[] for _ in range(world_size)]
    offsets = [len(groups)] * world_size
    for i in range(len(groups)):
        asked, asked_times = [], []
        for q in range(world_size):
            count = int(received[q][i])
            asked.append(received[q][offsets[q]:offsets[q] + count])
            offsets[q] += count
            if received_times is not None:
                asked_times.append(received_times[q][
                    time_offsets[q]:time_offsets[q] + count])
                time_offsets[q] += count
        counts, sources, edge_ids = serve(
            i, torch.cat(asked),
            None if received_times is None else torch.cat(asked_times))
        per_peer = counts.split([a.numel() for a in asked])
        num_edges = [int(c.sum()) for c in per_peer]
        for q, (c, s, d) in enumerate(zip(per_peer, sources.split(num_edges),
                                          edge_ids.split(num_edges))):
            replies[q] += [c, s, d]
    # This rank's own answers stay unpacked (all_to_all_v does not send
    # them).
    own = replies[rank]
    answers = comm.all_to_all_v([
        torch.cat(r) if q != rank else empty
        for q, r in enumerate(replies)])

    out = []
    for i, (requests, order, request_counts) in enumerate(groups):
        counts, sources, edge_ids = [], [], []
        for q in range(world_size):
            if q == rank:
                c, s, d = own[3 * i:3 * i + 3]
            else:
                c, s, d = _take(answers, q, request_counts[q])
            counts.append(c)
            sources.append(s)
            edge_ids.append(d)
        out.append(_frontier_order(requests, order, torch.cat(counts),
                                   torch.cat(sources), torch.cat(edge_ids)))
    return out


def _take(answers: List[Tensor], q: int, num_requests: int) -> Answer:
    """Reads the next ``[counts | sources | edge ids]`` block of peer
    ``q``'s answer, and drops it from ``answers[q]``."""
    answer = answers[q]
    counts = answer[:num_requests]
    num_edges = int(counts.sum())
    end = num_requests + num_edges
    sources, edge_ids = answer[num_requests:end], answer[end:end + num_edges]
    answers[q] = answer[end + num_edges:]
    return counts, sources, edge_ids


def _frontier_order(requests: Tensor, order: Tensor, counts: Tensor,
                    sources: Tensor, edge_ids: Tensor) -> Sampled:
    """``(target, source, edge id)`` of the answers (which come in owner
    order: ``requests = frontier[order]``), moved to frontier order
    (PyG's order) without a sort, and the edge count of every frontier
    entry."""
    targets = torch.repeat_interleave(requests, counts)
    in_frontier = torch.empty_like(counts)
    in_frontier[order] = counts
    if bool((order[1:] >= order[:-1]).all()):  # already in frontier order
        return targets, sources, edge_ids, in_frontier
    slot_start = torch.cumsum(in_frontier, 0) - in_frontier
    slots = ranges(slot_start[order], counts)
    out = [torch.empty_like(t) for t in (targets, sources, edge_ids)]
    for dst, src in zip(out, (targets, sources, edge_ids)):
        dst[slots] = src
    return out[0], out[1], out[2], in_frontier


def answer(edges, ids: Tensor, fanout: int, replace: bool,
           generator: torch.Generator, weight: Optional[Tensor] = None,
           times: Optional[Tensor] = None, edge_time: Optional[Tensor] = None,
           strategy: str = 'uniform') -> Answer:
    """What the owner answers for ``ids``, local destinations of ``edges``
    (an :class:`~pyg_sar.loader.shards.base.EdgeShard`): ``fanout`` in-edges
    each, in proportion to ``weight`` if given, or, with ``times`` (one per
    id) and ``edge_time`` (one per in-edge), among the edges no later than
    the id's time (:func:`~pyg_sar.loader.sampling.temporal.sample_temporal`,
    ``strategy``)."""
    if times is not None and edge_time is not None:
        counts, positions = sample_temporal(edges.csc_ptr, ids, times, fanout,
                                            edge_time, strategy, replace,
                                            generator)
    else:
        counts, positions = sample_neighbors(edges.csc_ptr, ids, fanout,
                                             replace, generator, weight)
    return counts, edges.csc_src[positions], edges.csc_eid[positions]
