"""Temporal neighbor sampling (PyG's ``time_attr``, ``input_time`` and
``temporal_strategy``).

Every seed has a time: its ``input_time``, or its own node time. Sampling
is disjoint, as in PyG: each seed grows its own subtree, and every edge
sampled anywhere in that subtree must be no later than the seed's time: an
edge's time is its own (``time_attr`` an edge attribute) or its source
node's (a node attribute). ``"uniform"`` draws uniformly among the edges
that qualify, ``"last"`` takes the most recent ones.

The owner of a target checks the times: it keeps the time of every in-edge
(edge attribute, or its source node's time, fetched from the source's owner
once when the loader is built) and receives each request's seed time with
the request.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.loader.sampler import _ranges

STRATEGIES = ('uniform', 'last')


def edge_times(shard, time_attr: str) -> Tuple[Tensor, Optional[Tensor]]:
    """``(time of every local in-edge in CSC order, node time of every local
    node or None)``; collective when the times are node times (the sources'
    times come from their owners)."""
    if time_attr in shard.edge_attrs:
        times = shard.edge_attrs[time_attr]
        node_time = None
    elif time_attr in shard.node_attrs:
        node_time = shard.node_attrs[time_attr]
        times = node_times(shard, node_time, shard.csc_src)
    else:
        raise ValueError(
            f"time_attr {time_attr!r} is neither a node nor an edge "
            f"attribute of the part (node: {sorted(shard.node_attrs)}, "
            f"edge: {sorted(shard.edge_attrs)})")
    if times.dim() != 1 or times.is_complex() or times.dtype == torch.bool:
        raise ValueError(f"time_attr {time_attr!r} must be one number per "
                         f"{'edge' if node_time is None else 'node'} (got "
                         f"shape {list(times.shape)}, {times.dtype})")
    return times, node_time


def sample_temporal(ptr: Tensor, targets: Tensor, seed_time: Tensor,
                    fanout: int, times: Tensor, strategy: str,
                    replace: bool, generator: Optional[torch.Generator]
                    ) -> Tuple[Tensor, Tensor]:
    """``(counts, positions)`` as :func:`~pyg_sar.loader.sample_neighbors`,
    among the in-edges of each target whose time is at most its
    ``seed_time``: uniformly (``replace``: ``fanout`` draws) or the
    ``fanout`` most recent (``"last"``; ties: the later CSC position)."""
    targets = targets.to(torch.long)
    starts = ptr[targets]
    degrees = ptr[targets + 1] - starts
    candidates = _ranges(starts, degrees)
    segment = torch.repeat_interleave(torch.arange(targets.numel()), degrees)
    valid = times[candidates] <= seed_time[segment]
    num_valid = torch.zeros(targets.numel(), dtype=torch.long).index_add_(
        0, segment, valid.long())
    if fanout < 0:
        return num_valid, candidates[valid]
    if replace and strategy == 'uniform':
        counts = torch.where(num_valid > 0, fanout, 0)
        valid_positions = candidates[valid]
        first = torch.cumsum(num_valid, 0) - num_valid
        total = int(counts.sum())
        base = torch.repeat_interleave(first, counts, output_size=total)
        size = torch.repeat_interleave(num_valid, counts, output_size=total)
        draw = (torch.rand(total, generator=generator, dtype=torch.float64)
                * size).long()
        return counts, valid_positions[base + torch.minimum(draw, size - 1)]
    counts = num_valid.clamp(max=fanout)
    if strategy == 'uniform':
        keys = torch.rand(candidates.numel(), generator=generator,
                          dtype=torch.float64)
    else:  # most recent first; among equal times the later position
        keys = times[candidates].to(torch.float64)
    keys = torch.where(valid, keys, torch.full_like(keys, -float('inf')))
    by_key = torch.argsort(keys, descending=True, stable=True) \
        if strategy == 'uniform' else _last_order(keys, candidates)
    order = by_key[torch.argsort(segment[by_key], stable=True)]
    seg_start = torch.cumsum(degrees, 0) - degrees
    return counts, candidates[order[_ranges(seg_start, counts)]]


def _last_order(keys: Tensor, candidates: Tensor) -> Tensor:
    """Candidates by key descending, ties by position descending."""
    by_position = torch.argsort(candidates, descending=True, stable=True)
    return by_position[torch.argsort(keys[by_position], descending=True,
                                     stable=True)]


def seed_times(loader, input_time: Optional[Tensor],
               node_time: Optional[Tensor]) -> Tensor:
    """The time of every input node of ``loader``: ``input_time`` (one per
    input node), or the input nodes' own node times."""
    seeds = loader.input_nodes
    if input_time is not None:
        input_time = torch.as_tensor(input_time)
        if input_time.dim() != 1 or input_time.numel() != seeds.numel():
            raise ValueError(f"input_time must hold one time per input node "
                             f"({seeds.numel()}), got shape "
                             f"{list(input_time.shape)}")
        return input_time
    if node_time is None:
        raise ValueError("time_attr is an edge attribute: pass input_time, "
                         "the seeds' times")
    return node_time[seeds - loader.shard.node_start]


def node_times(shard, node_time: Tensor, ids: Tensor) -> Tensor:
    """The times of any global node ids, from their owners, each of which
    holds ``node_time`` of its own nodes (collective)."""
    return comm.ask_owners(ids, shard.owner(ids),
                           lambda asked: node_time[asked - shard.node_start])


def earliest_node(loader) -> int:
    """The global id of a node with the smallest time (collective)."""
    shard = loader.shard
    if loader.node_time.numel():
        local = int(torch.argmin(loader.node_time))
        mine = (loader.node_time[local].item(), shard.node_start + local)
    else:
        mine = (float('inf'), -1)
    return min(comm.all_gather_object(mine))[1]


def temporal_negatives(loader, draw, seed_time: Tensor,
                       rounds: int = 5) -> Tensor:
    """PyG's greedy temporal negatives: draw one node per entry of
    ``seed_time`` (``draw(n)``), re-draw those later than their seed time up
    to ``rounds`` times, and give what is still invalid the earliest node.
    Collective: every rank runs the same number of lookups."""
    def times_of(ids: Tensor) -> Tensor:
        return node_times(loader.shard, loader.node_time, ids)

    out = draw(seed_time.numel())
    for _ in range(rounds):
        invalid = times_of(out) > seed_time
        out[invalid] = draw(int(invalid.sum()))
    invalid = times_of(out) > seed_time
    if not hasattr(loader, '_earliest_node'):
        loader._earliest_node = earliest_node(loader)
    out[invalid] = loader._earliest_node
    return out
