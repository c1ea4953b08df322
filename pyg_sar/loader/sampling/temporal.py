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

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.loader.sampling.kernel import ranges

STRATEGIES = ('uniform', 'last')


def edge_times(shard, time_attr: str) -> Tuple[Tensor, Optional[Tensor]]:
    """``(time of every local in-edge in CSC order, node time of every local
    node or None)`` of a homogeneous shard; collective when the times are
    node times (the sources' times come from their owners)."""
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
    one_per_row(times, time_attr, 'edge' if node_time is None else 'node')
    return times, node_time


def typed_edge_times(shard, time_attr: str
                     ) -> Tuple[Dict[Tuple, Optional[Tensor]],
                                Dict[str, Tensor]]:
    """``(time of every local in-edge per edge type in CSC order, None
    where not filtered; node time of every local node per node type that
    has one)`` of a heterogeneous shard: an edge's own time, else its
    source's. Collective: node times of sources come from their owners."""
    node_time = {}
    for t, nodes in shard.nodes.items():
        if time_attr in nodes.node_attrs:
            node_time[t] = one_per_row(nodes.node_attrs[time_attr],
                                       time_attr, f'{t!r} node')
    edge_time: Dict[Tuple, Optional[Tensor]] = {}
    for e, edges in shard.edges.items():
        if time_attr in edges.edge_attrs:
            edge_time[e] = one_per_row(edges.edge_attrs[time_attr],
                                       time_attr, f'{e} edge')
        elif e[0] in node_time:  # every rank runs the same lookups
            edge_time[e] = node_times(shard.nodes[e[0]], node_time[e[0]],
                                      edges.csc_src)
        else:
            edge_time[e] = None
    if all(t is None for t in edge_time.values()):
        raise ValueError(f"time_attr {time_attr!r} is neither a node "
                         f"attribute of a source type nor an edge attribute "
                         f"of any edge type of the part")
    return edge_time, node_time


def one_per_row(value: Tensor, name: str, what: str) -> Tensor:
    """``value``, after checking it holds one real number per ``what``."""
    if value.dim() != 1 or value.is_complex() or value.dtype == torch.bool:
        raise ValueError(f"time_attr {name!r} must be one number per "
                         f"{what} (got shape {list(value.shape)}, "
                         f"{value.dtype})")
    return value


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
    candidates = ranges(starts, degrees)
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
    return counts, candidates[order[ranges(seg_start, counts)]]


def _last_order(keys: Tensor, candidates: Tensor) -> Tensor:
    """Candidates by key descending, ties by position descending."""
    by_position = torch.argsort(candidates, descending=True, stable=True)
    return by_position[torch.argsort(keys[by_position], descending=True,
                                     stable=True)]


def seed_times(seeds: Tensor, start: int, input_time: Optional[Tensor],
               node_time: Optional[Tensor], without: str) -> Tensor:
    """The time of every seed (global ids ``seeds`` of this rank's nodes
    from ``start``): ``input_time`` (one per seed), else the seeds' own
    ``node_time``; ``without`` is the error when there is neither."""
    if input_time is not None:
        input_time = torch.as_tensor(input_time)
        if input_time.dim() != 1 or input_time.numel() != seeds.numel():
            raise ValueError(f"input_time must hold one time per input node "
                             f"({seeds.numel()}), got shape "
                             f"{list(input_time.shape)}")
        return input_time
    if node_time is None:
        raise ValueError(without)
    return node_time[seeds - start]


def node_times(shard, node_time: Tensor, ids: Tensor) -> Tensor:
    """The times of any global node ids, from their owners, each of which
    holds ``node_time`` of its own nodes (collective)."""
    return comm.ask_owners(ids, shard.owner(ids),
                           lambda asked: node_time[asked - shard.node_start])


def pick_times(input_time: Optional[Tensor], positions: Tensor
               ) -> Optional[Tensor]:
    """The times of this rank's inputs: ``input_time`` holds one per input
    node the user gave (PyG's ``input_time``), ``positions`` are this
    rank's inputs' positions in them."""
    if input_time is None:
        return None
    input_time = torch.as_tensor(input_time)
    if input_time.dim() != 1 or (positions.numel() and
                                 int(positions.max()) >= input_time.numel()):
        raise ValueError(f"input_time must hold one time per input node "
                         f"(got shape {list(input_time.shape)} for at least "
                         f"{int(positions.max()) + 1 if positions.numel() else 0}"
                         f" input nodes)")
    return input_time[positions]
