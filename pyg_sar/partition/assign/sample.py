r"""KaMinPar on a sample of the edges where the whole graph would not fit the
memory budget, streamed.

KaMinPar's peak is its compressed input plus its first coarse graph:
measured, 6.8 bytes per adjacency entry on ``synthetic_graph``'s model and
8.9 on a graph where half of the edges join uniformly random nodes (its
first coarse graph keeps almost every random edge, and its Python bindings
offer no setting that coarsens harder).
Where that worst case would exceed :obj:`KAMINPAR_BYTES_PER_EDGE` bytes per
input edge, KaMinPar gets a uniform sample of the undirected edges instead
(:func:`write_sampled_parhip`: both directions of an edge kept or dropped
together, by a seeded hash of the pair, so the sample is symmetric and
reproducible); the cut it leaves is then improved on the whole graph
(:func:`~pyg_sar.partition.assign.refine.refine_cut`). Dropping a share of
the edges at random keeps a community structure (each community loses the
same share of its inner and outer edges)."""
import os
import shutil
from typing import Dict

import numpy as np
import torch
from torch import Tensor

from pyg_sar.partition.assign.symmetric import (PARHIP_HEADER_BYTES, CsrView,
                                                parhip_format)

# KaMinPar's measured peak per adjacency entry on the half-random graph of
# the partition benchmark (20M nodes, 800M entries: 6.60 GiB).
KAMINPAR_BYTES_PER_ENTRY = 8.9
# The share of the run's budget (12 bytes per input edge plus 16 per node)
# KaMinPar may take, per input edge; the rest is the waiting caller's.
KAMINPAR_BYTES_PER_EDGE = 10.0
# Below this many adjacency entries KaMinPar always gets the whole graph
# (its worst case stays under about 1.2 GiB).
SAMPLE_MIN_ENTRIES = 1 << 27
# Multiplier of the pair hash (2**64 / golden ratio, as a signed int64).
_HASH = -7046029254386353131


def sample_rate(num_entries: int, num_edges: int) -> float:
    r"""The share of undirected edges KaMinPar gets: 1 below
    :obj:`SAMPLE_MIN_ENTRIES` adjacency entries or where the worst case
    (:obj:`KAMINPAR_BYTES_PER_ENTRY` per entry) fits
    :obj:`KAMINPAR_BYTES_PER_EDGE` per input edge, else the share that
    fits."""
    if num_entries < SAMPLE_MIN_ENTRIES:
        return 1.0
    return min(1.0, KAMINPAR_BYTES_PER_EDGE * num_edges /
               (KAMINPAR_BYTES_PER_ENTRY * num_entries))


def _kept(row: Tensor, col: Tensor, num_nodes: int, rate: float,
          seed: int) -> Tensor:
    r"""Whether the undirected edge of every entry is in the sample: the
    same answer for :obj:`(u, v)` and :obj:`(v, u)`."""
    lo, hi = torch.minimum(row, col), torch.maximum(row, col)
    key = (lo * num_nodes + hi) ^ int(seed)
    bits = ((key * _HASH) >> 32) & 0xFFFFFFFF
    return bits < int(rate * 2**32)


def write_sampled_parhip(view: CsrView, path: str, rate: float,
                         seed: int = 0) -> Dict[str, int]:
    r"""Writes the sample of :obj:`view` (a symmetric adjacency) that keeps
    every undirected edge with probability :obj:`rate` to the ParHIP file
    :obj:`path`, one pass over :obj:`view` (the kept neighbors go to a
    scratch file beside :obj:`path`, then after the offsets). Returns
    :obj:`num_entries` (kept adjacency entries)."""
    n = view.num_nodes
    degree = torch.zeros(n, dtype=torch.long)
    scratch, tmp = path + '.neighbors', path + '.tmp'
    try:
        with open(scratch, 'wb') as f:
            for r0, r1, col in view.chunks():
                deg = view.rowptr[r0 + 1:r1 + 1] - view.rowptr[r0:r1]
                row = torch.repeat_interleave(torch.arange(r0, r1), deg)
                keep = _kept(row, col, n, rate, seed)
                degree[r0:r1] = torch.zeros(r1 - r0, dtype=torch.long) \
                    .index_add_(0, row[keep] - r0,
                                torch.ones(1, dtype=torch.long).expand(
                                    int(keep.sum())))
                f.write(col[keep].numpy().astype(
                    np.uint32 if n < 2**32 else np.uint64).tobytes())
                del row, keep, col
        m = int(degree.sum())
        version, node_bytes, edge_bytes = parhip_format(n, m)
        base = PARHIP_HEADER_BYTES + (n + 1) * edge_bytes
        rowptr = torch.zeros(n + 1, dtype=torch.long)
        torch.cumsum(degree, 0, out=rowptr[1:])
        del degree
        with open(tmp, 'wb') as f:
            f.write(np.array([version, n, m], dtype=np.uint64).tobytes())
            f.write((rowptr * node_bytes + base).numpy().astype(
                np.uint32 if edge_bytes == 4 else np.uint64).tobytes())
            with open(scratch, 'rb') as src:
                shutil.copyfileobj(src, f, 1 << 24)
        os.replace(tmp, path)
    finally:
        for name in (scratch, tmp):
            if os.path.exists(name):
                os.remove(name)
    return {'num_entries': m}


__all__ = ['sample_rate', 'write_sampled_parhip', 'KAMINPAR_BYTES_PER_ENTRY',
           'KAMINPAR_BYTES_PER_EDGE', 'SAMPLE_MIN_ENTRIES']
