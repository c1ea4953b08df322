"""Negatives of link batches, as PyG's ``LinkNeighborLoader`` draws them:
its ``NegativeSampling`` read from the loader's arguments
(:func:`negative_sampling`), node ids drawn over a whole node type, all
parts (:func:`draw_negatives`), and, with node timestamps, PyG's greedy
re-draws of negatives later than their pair (:func:`temporal_negatives`).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.loader.sampling.temporal import node_times


def negative_sampling(neg_sampling, neg_sampling_ratio):
    """PyG's ``NegativeSampling`` (or ``None``) from the loader's
    arguments, as ``LinkNeighborLoader`` reads them."""
    from torch_geometric.sampler import NegativeSampling
    if neg_sampling_ratio is not None and neg_sampling_ratio != 0.0:
        if neg_sampling is not None:
            raise ValueError("pass either 'neg_sampling' or the deprecated "
                             "'neg_sampling_ratio', not both")
        neg_sampling = NegativeSampling('binary', neg_sampling_ratio)
    if neg_sampling is None:
        return None
    if isinstance(neg_sampling, dict):
        neg_sampling = NegativeSampling(**neg_sampling)
    elif isinstance(neg_sampling, str):
        neg_sampling = NegativeSampling(neg_sampling)
    if not isinstance(neg_sampling, NegativeSampling):
        raise TypeError(f"'neg_sampling' must be a NegativeSampling, a mode "
                        f"('binary' or 'triplet') or a dict of its arguments "
                        f"(got {type(neg_sampling).__name__})")
    return neg_sampling


def draw_negatives(num: int, num_nodes: int, weight: Optional[Tensor],
                   generator: torch.Generator, endpoint: str,
                   node: str) -> Tensor:
    """``num`` ids among ``num_nodes`` (a node type's global ids, every
    part's), uniformly or in proportion to ``weight`` (the
    ``NegativeSampling`` weights of the ``endpoint``, ``'src'`` or
    ``'dst'``; one per ``node``, named so in the error)."""
    if weight is None:
        return torch.randint(num_nodes, (num, ), generator=generator)
    if weight.numel() != num_nodes:
        raise ValueError(f"NegativeSampling.{endpoint}_weight has "
                         f"{weight.numel()} entries; expected one per "
                         f"{node} ({num_nodes}), in partition ids")
    return torch.multinomial(weight, num, replacement=True,
                             generator=generator)


def earliest_node(shard, node_time: Tensor) -> int:
    """The global id of a node with the smallest time (collective)."""
    if node_time.numel():
        local = int(torch.argmin(node_time))
        mine = (node_time[local].item(), shard.node_start + local)
    else:
        mine = (float('inf'), -1)
    return min(comm.all_gather_object(mine))[1]


def temporal_negatives(shard, node_time: Tensor,
                       draw: Callable[[int], Tensor], seed_time: Tensor,
                       earliest: Callable[[], int], rounds: int = 5
                       ) -> Tensor:
    """PyG's greedy temporal negatives: draw one node per entry of
    ``seed_time`` (``draw(n)``), re-draw those later than their seed time up
    to ``rounds`` times, and give what is still invalid the earliest node
    (``earliest()``, :func:`earliest_node`). Collective: every rank runs the
    same number of lookups of the times (``node_time`` of the nodes of
    ``shard``)."""
    def times_of(ids: Tensor) -> Tensor:
        return node_times(shard, node_time, ids)

    out = draw(seed_time.numel())
    for _ in range(rounds):
        invalid = times_of(out) > seed_time
        out[invalid] = draw(int(invalid.sum()))
    invalid = times_of(out) > seed_time
    out[invalid] = earliest()
    return out
