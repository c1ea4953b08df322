"""Vectorized uniform neighbor sampling over a CSC adjacency.

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


def _ranges(starts: Tensor, lengths: Tensor) -> Tensor:
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
    candidate edge draws a key, a sort by ``(target, key)`` shuffles each
    target's segment, and the first ``fanout`` of each segment are kept."""
    total = int(degrees.sum())
    segment = torch.repeat_interleave(torch.arange(degrees.numel()), degrees,
                                      output_size=total)
    keys = torch.rand(total, generator=generator, dtype=torch.float64)
    # Segment index plus a key in [0, 1): one sort orders by (segment, key).
    order = torch.argsort(segment.to(torch.float64) + keys)
    candidates = _ranges(starts, degrees)[order]
    offsets = torch.cumsum(degrees, 0) - degrees
    rank_in_segment = torch.arange(total) - offsets[segment]
    return candidates[rank_in_segment < fanout]


def _sample_by_rejection(starts: Tensor, degrees: Tensor, fanout: int,
                         generator: Optional[torch.Generator]) -> Tensor:
    """``fanout`` distinct positions per target for targets with
    ``degree >> fanout``: draw with replacement, then re-draw every duplicate
    until none are left. The process treats all of a target's edges alike, so
    every ``fanout``-subset is equally likely."""
    num_targets = degrees.numel()
    segment = torch.arange(num_targets).repeat_interleave(fanout)
    seg_degree = degrees[segment]
    offsets = (torch.rand(segment.numel(), generator=generator,
                          dtype=torch.float64) * seg_degree).long()
    offsets = torch.minimum(offsets, seg_degree - 1)
    max_degree = int(degrees.max())
    for _ in range(MAX_REJECTION_ROUNDS):
        code = segment * max_degree + offsets
        sorted_code, order = torch.sort(code)
        duplicate = torch.zeros_like(sorted_code, dtype=torch.bool)
        duplicate[1:] = sorted_code[1:] == sorted_code[:-1]
        redraw = order[duplicate]
        if redraw.numel() == 0:
            break
        fresh = torch.rand(redraw.numel(), generator=generator,
                           dtype=torch.float64) * seg_degree[redraw]
        offsets[redraw] = torch.minimum(fresh.long(), seg_degree[redraw] - 1)
    else:  # pragma: no cover - needs astronomically bad luck
        raise RuntimeError('rejection sampling did not converge')
    return starts[segment] + offsets


def sample_neighbors(
    ptr: Tensor,
    targets: Tensor,
    fanout: int,
    replace: bool = False,
    generator: Optional[torch.Generator] = None,
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
        return degrees, _ranges(starts, degrees)
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
        slots = _ranges(out_offsets[group], group_counts)
        if sample is None:
            positions[slots] = _ranges(starts[group], group_counts)
        else:
            positions[slots] = sample(starts[group], degrees[group], fanout,
                                      generator)
    return counts, positions
