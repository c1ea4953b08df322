"""Balancing the inputs of a loader across ranks (the default,
``pad_batches=None``): every rank gets ``total // world_size`` inputs (the
first ``total % world_size`` ranks one more), so that every rank yields
the same number of batches, none of them empty while there are at least
``world_size`` inputs per batch index.

Sampling is collective (a seed's neighborhood is drawn by the owners of
the nodes it reaches), so a seed need not be batched by its owner: only
the surplus moves, from the ranks with more inputs than their share to
those with fewer, the last inputs of a rank first, the ranks paired in
order (:func:`transfers`); every other input stays with its rank.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import torch
from torch import Tensor

from pyg_sar import comm


def shares(counts: Sequence[int]) -> List[int]:
    """Every rank's number of inputs after balancing."""
    world_size = len(counts)
    base, extra = divmod(sum(counts), world_size)
    return [base + (r < extra) for r in range(world_size)]


def transfers(counts: Sequence[int]) -> List[List[int]]:
    """``moves[s][r]``: how many inputs rank ``s`` hands rank ``r``: the
    surpluses of the ranks above their share, in rank order, fill the
    deficits of the ranks below theirs, in rank order."""
    target = shares(counts)
    world_size = len(counts)
    moves = [[0] * world_size for _ in range(world_size)]
    give = [max(c - t, 0) for c, t in zip(counts, target)]
    take = [max(t - c, 0) for c, t in zip(counts, target)]
    s = r = 0
    while s < world_size and r < world_size:
        if give[s] == 0:
            s += 1
            continue
        if take[r] == 0:
            r += 1
            continue
        amount = min(give[s], take[r])
        moves[s][r] += amount
        give[s] -= amount
        take[r] -= amount
    return moves


def rebalance(columns: Dict[str, Tensor], counts: Sequence[int], rank: int
              ) -> Dict[str, Tensor]:
    """This rank's inputs after balancing (collective on the loaders'
    channel; every rank passes every rank's ``counts`` and the same column
    names, dtypes and row shapes): ``columns`` holds one row per input of
    this rank (its ids, positions, times, labels, ...); the rows kept come
    first, then those received, from rank 0 up."""
    moves = transfers(counts)
    if not any(any(row) for row in moves):
        return columns
    sent = moves[rank]
    keep = counts[rank] - sum(sent)
    out = {}
    with comm.on_channel('loader'):
        for name, value in columns.items():
            pieces = list(value[keep:].split(sent))
            pieces[rank] = value[:0]
            received = comm.all_to_all_v(pieces)
            out[name] = torch.cat([value[:keep]] + [
                received[q] for q in range(len(counts)) if q != rank])
    return out
