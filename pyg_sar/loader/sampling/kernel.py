"""Vectorized uniform (or weighted) neighbor sampling over a CSC adjacency.

Everything here is plain PyTorch on whole tensors: there is no Python loop
over nodes or edges, so the kernel needs neither pyg-lib nor torch_sparse.

The kernel answers one question: given target nodes (rows of a CSC pointer
array) and a fanout, which in-edge *positions* (indices into the CSC edge
arrays) are sampled for each target? Mapping positions to source ids and
edge ids is left to the caller, who owns those arrays.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

# Without replacement, targets whose in-degree exceeds the fanout by more than
# this factor use rejection sampling (draw, re-draw duplicates): its cost is
# O(fanout) per target and collisions are rare. Below the factor, random keys
# over all candidate edges plus one segmented sort is cheaper than the
# expected number of rejection rounds, and costs O(in-degree) per target.
REJECTION_DEGREE_RATIO = 4

# Bound on rejection rounds; each round re-draws only the duplicates, whose
# number shrinks geometrically (at most 1 / REJECTION_DEGREE_RATIO of the
# draws collide), so this is never reached in practice.
MAX_REJECTION_ROUNDS = 64


def ranges(starts: Tensor, lengths: Tensor) -> Tensor:
    """Concatenation of ``arange(s, s + l)`` for every ``(s, l)`` pair."""
    total = int(lengths.sum()) if lengths.numel() else 0
    if total == 0:
        return torch.empty(0, dtype=torch.long)
    offsets = torch.cumsum(lengths, 0) - lengths  # exclusive prefix sum
    within = torch.arange(total) - torch.repeat_interleave(offsets, lengths,
                                                           output_size=total)
    return torch.repeat_interleave(starts, lengths, output_size=total) + within


def _sample_by_keys(starts: Tensor, degrees: Tensor, fanout: int,
                    generator: Optional[torch.Generator]) -> Tensor:
    """``fanout`` distinct positions per target via random keys: every
    candidate edge draws a key and the ``fanout`` smallest keys of each
    target win. Targets are rows of a ``[num_targets, max_degree]`` key
    matrix (padding keys are 2, above every real key in [0, 1)), so the
    selection is one row-wise ``topk`` over short rows instead of a global
    sort; degrees here are at most ``REJECTION_DEGREE_RATIO * fanout``."""
    max_degree = int(degrees.max())
    keys = torch.rand(degrees.numel(), max_degree, generator=generator)
    keys.masked_fill_(torch.arange(max_degree) >= degrees.unsqueeze(1), 2.0)
    chosen = torch.topk(keys, fanout, dim=1, largest=False,
                        sorted=False).indices
    return (starts.unsqueeze(1) + chosen).view(-1)


def _sample_by_rejection(starts: Tensor, degrees: Tensor, fanout: int,
                         generator: Optional[torch.Generator]) -> Tensor:
    """``fanout`` distinct positions per target for targets with
    ``degree >> fanout``: draw with replacement, then re-draw every duplicate
    until none are left. The process treats all of a target's edges alike, so
    every ``fanout``-subset is equally likely."""
    num_targets = degrees.numel()
    # One row of `fanout` draws per target; duplicates are found by sorting
    # each short row, not by a global sort.
    row_degree = degrees.unsqueeze(1).expand(num_targets, fanout)
    offsets = (torch.rand(num_targets, fanout, generator=generator,
                          dtype=torch.float64) * row_degree).long()
    offsets = torch.minimum(offsets, row_degree - 1)
    for _ in range(MAX_REJECTION_ROUNDS):
        sorted_offsets, order = torch.sort(offsets, dim=1)
        duplicate = sorted_offsets[:, 1:] == sorted_offsets[:, :-1]
        if not bool(duplicate.any()):
            break
        rows, cols = duplicate.nonzero(as_tuple=True)
        cols = order[rows, cols + 1]  # keep the first of equal draws
        fresh = torch.rand(rows.numel(), generator=generator,
                           dtype=torch.float64) * degrees[rows]
        offsets[rows, cols] = torch.minimum(fresh.long(), degrees[rows] - 1)
    else:  # pragma: no cover - needs astronomically bad luck
        raise RuntimeError('rejection sampling did not converge')
    return (starts.unsqueeze(1) + offsets).view(-1)


def _sample_weighted(starts: Tensor, degrees: Tensor, fanout: int,
                     replace: bool, weight: Tensor,
                     generator: Optional[torch.Generator]
                     ) -> Tuple[Tensor, Tensor]:
    """Weighted sampling: an edge's chance is proportional to its weight
    (weight 0: never sampled). With replacement every target with positive
    total weight gets ``fanout`` independent draws; without, ``min(number
    of positive-weight edges, fanout)`` distinct edges, drawn one after the
    other in proportion to the remaining weights (Efraimidis-Spirakis keys
    ``log(u) / w``, the largest win; one segmented sort)."""
    candidates = ranges(starts, degrees)
    w = weight[candidates].to(torch.float64)
    segment = torch.repeat_interleave(torch.arange(degrees.numel()), degrees)
    positive = torch.zeros(degrees.numel(), dtype=torch.long).index_add_(
        0, segment, (w > 0).long())
    if replace:
        counts = torch.where(positive > 0, fanout, 0)
        cum = torch.cumsum(w, 0)
        seg_end = torch.cumsum(degrees, 0)
        seg_lo = torch.cat([cum.new_zeros(1), cum])[seg_end - degrees]
        seg_hi = torch.cat([cum.new_zeros(1), cum])[seg_end]
        total = int(counts.sum())
        lo = torch.repeat_interleave(seg_lo, counts, output_size=total)
        hi = torch.repeat_interleave(seg_hi, counts, output_size=total)
        draw = lo + torch.rand(total, generator=generator,
                               dtype=torch.float64) * (hi - lo)
        picked = torch.searchsorted(cum, draw, right=True)
        # Rounding at a segment's end: stay on its last positive edge.
        last = torch.repeat_interleave(seg_end - 1, counts,
                                       output_size=total)
        picked = torch.minimum(picked, last)
        return counts, candidates[picked]
    counts = positive.clamp(max=fanout)
    u = torch.rand(w.numel(), generator=generator, dtype=torch.float64)
    keys = torch.where(w > 0, torch.log(u) / w,
                       torch.full_like(w, -float('inf')))
    # Sort by key (descending), then stably by target: each target's edges
    # end up contiguous, best key first.
    by_key = torch.argsort(keys, descending=True, stable=True)
    order = by_key[torch.argsort(segment[by_key], stable=True)]
    seg_start = torch.cumsum(degrees, 0) - degrees
    chosen = order[ranges(seg_start, counts)]
    return counts, candidates[chosen]


def sample_neighbors(
    ptr: Tensor,
    targets: Tensor,
    fanout: int,
    replace: bool = False,
    generator: Optional[torch.Generator] = None,
    weight: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Samples in-edges of ``targets`` uniformly from a CSC adjacency.

    Args:
        ptr (LongTensor): CSC pointer ``[num_rows + 1]``; the in-edges of row
            ``v`` are positions ``ptr[v]:ptr[v + 1]``.
        targets (LongTensor): Rows to sample for, ``[num_targets]``
            (duplicates are sampled independently).
        fanout (int): Edges per target; ``-1`` takes all in-edges.
        replace (bool): Sample with replacement: every target with at least
            one in-edge gets exactly ``fanout`` edges (as in PyG). Without
            replacement a target gets ``min(in_degree, fanout)`` distinct
            edges.
        generator (torch.Generator, optional): Source of randomness.
        weight (Tensor, optional): A non-negative weight per CSC position:
            edges are drawn in proportion to it (PyG's ``weight_attr``);
            zero-weight edges are never drawn. ``fanout=-1`` still takes
            every in-edge.

    Returns:
        ``(counts, positions)``: ``counts[i]`` (LongTensor ``[num_targets]``)
        edges were sampled for ``targets[i]``; ``positions`` (LongTensor
        ``[counts.sum()]``) are their CSC positions, grouped by target in the
        order of ``targets``.
    """
    targets = targets.to(torch.long)
    starts = ptr[targets]
    degrees = ptr[targets + 1] - starts
    if fanout < 0:
        return degrees, ranges(starts, degrees)
    if weight is not None:
        return _sample_weighted(starts, degrees, fanout, replace, weight,
                                generator)
    if replace:
        counts = torch.where(degrees > 0, fanout, 0)
        total = int(counts.sum())
        seg_start = torch.repeat_interleave(starts, counts, output_size=total)
        seg_degree = torch.repeat_interleave(degrees, counts,
                                             output_size=total)
        draw = (torch.rand(total, generator=generator, dtype=torch.float64) *
                seg_degree).long()
        return counts, seg_start + torch.minimum(draw, seg_degree - 1)

    counts = degrees.clamp(max=fanout)
    total = int(counts.sum())
    positions = torch.empty(total, dtype=torch.long)
    out_offsets = torch.cumsum(counts, 0) - counts

    # Three groups, each sampled in bulk and written to its targets' slots.
    take_all = degrees <= fanout
    by_keys = (~take_all) & (degrees <= REJECTION_DEGREE_RATIO * fanout)
    by_rejection = degrees > REJECTION_DEGREE_RATIO * fanout
    for group, sample in ((take_all, None), (by_keys, _sample_by_keys),
                          (by_rejection, _sample_by_rejection)):
        if not bool(group.any()):
            continue
        group_counts = counts[group]
        slots = ranges(out_offsets[group], group_counts)
        if sample is None:
            positions[slots] = ranges(starts[group], group_counts)
        else:
            positions[slots] = sample(starts[group], degrees[group], fanout,
                                      generator)
    return counts, positions
