r"""The symmetrized graph written straight to KaMinPar's ParHIP file, out of
core: :func:`write_symmetric_parhip` never holds the whole adjacency.

One pass over the :class:`~pyg_sar.partition.input.edge_source.EdgeSource`
counts every node's entries of both directions
(:func:`~pyg_sar.partition.assign.symmetric.symmetric_degrees`); the nodes
are then cut into consecutive ranges whose entries fit a memory budget, and
for every range one more pass keeps the entries whose row falls in it,
sorts and deduplicates them row by row
(:func:`~pyg_sar.partition.assign.symmetric.symmetric_rows`) and appends
the range's neighbors to the file. The offsets, known once every range is
deduplicated, are written last. The file is byte for byte the one of
:func:`~pyg_sar.partition.assign.symmetric.write_parhip` on
:func:`~pyg_sar.partition.assign.symmetric.symmetric_csr` (so KaMinPar,
given the same seed, returns the same assignment); the caller holds 8
bytes per node, the budget, and one chunk of work space, instead of 4 bytes
per adjacency entry plus 24 per node. A budget that holds every entry is
one range: the two passes of the in-memory path."""
import os
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from pyg_sar.partition.assign.symmetric import (PARHIP_HEADER_BYTES,
                                                parhip_format,
                                                symmetric_degrees,
                                                symmetric_rows)
from pyg_sar.partition.input.edge_source import (DEFAULT_CHUNK_EDGES,
                                                 EdgeSource)

# Memory of one range: its neighbors (4 bytes per entry before
# deduplication, 8 with 2**31 nodes or more) and its row pointers and
# cursors (16 bytes per row).
BYTES_PER_ROW = 16
# The default budget: bytes per input edge (the whole in-memory adjacency is
# about 8; KaMinPar's memory-efficient run needs about 7 on graphs with a
# community structure, so the caller stays well below it; a range costs one
# pass over the edges, each about a tenth of the symmetrization's time), and
# its floor (below it, small graphs take one range).
DEFAULT_BYTES_PER_EDGE = 2
MIN_BUDGET_BYTES = 256 << 20
# Rows scanned at a time when the ranges are cut.
_PLAN_BLOCK = 1 << 22


def default_budget(num_edges: int) -> int:
    r"""The default memory budget of :func:`write_symmetric_parhip`:
    :obj:`DEFAULT_BYTES_PER_EDGE` bytes per input edge, at least
    :obj:`MIN_BUDGET_BYTES`."""
    return int(max(MIN_BUDGET_BYTES, DEFAULT_BYTES_PER_EDGE * int(num_edges)))


def row_ranges(deg: Tensor, budget_bytes: int, entry_bytes: int = 4
               ) -> Iterator[Tuple[int, int]]:
    r"""Consecutive node ranges :obj:`(r0, r1)` covering every node, each
    needing at most :obj:`budget_bytes` (:obj:`entry_bytes` per entry of
    :obj:`deg` plus :obj:`BYTES_PER_ROW` per row), or one row if that row
    alone needs more."""
    n = deg.numel()
    r0, used = 0, 0
    for lo in range(0, n, _PLAN_BLOCK):
        cost = deg[lo:lo + _PLAN_BLOCK] * entry_bytes + BYTES_PER_ROW
        ends = torch.cumsum(cost, dim=0)
        pos = lo
        while pos < lo + cost.numel():
            # The first row of the block past the range's budget.
            offset = int(ends[pos - lo - 1]) if pos > lo else 0
            limit = budget_bytes - used + offset
            stop = lo + int(torch.searchsorted(ends, limit, right=True))
            if stop >= lo + cost.numel():  # the range goes on past the block
                used += int(ends[-1]) - offset
                break
            if stop == r0:  # one row over the budget: a range of its own
                stop = r0 + 1
            yield r0, stop
            r0, used, pos = stop, 0, stop
        del cost, ends
    if r0 < n:
        yield r0, n


def write_symmetric_parhip(source: EdgeSource, path: str,
                           budget_bytes: Optional[int] = None,
                           chunk_edges: int = DEFAULT_CHUNK_EDGES
                           ) -> Dict[str, Any]:
    r"""Writes the symmetrized graph of :obj:`source` (both directions, self
    loops dropped, duplicates removed) to the ParHIP file :obj:`path`,
    a range of rows at a time (see the module description). The file is
    written under a temporary name and renamed when complete. Returns
    :obj:`num_nodes`, :obj:`num_entries` (adjacency entries),
    :obj:`num_ranges` (passes over the source after the degree pass) and
    :obj:`budget_bytes`.

    Args:
        source (EdgeSource): The directed edges.
        path (str): The ParHIP file to write.
        budget_bytes (int, optional): Memory for one range's entries and
            rows. (default: :func:`default_budget`)
        chunk_edges (int, optional): Edges per chunk of every pass.
    """
    n = source.num_nodes
    if budget_bytes is None:
        budget_bytes = default_budget(source.num_edges)
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) \
            or budget_bytes < 1:
        raise ValueError(f"'budget_bytes' must be a positive int (got "
                         f"{budget_bytes!r})")
    deg = symmetric_degrees(source, chunk_edges)
    upper = int(deg.sum())
    _, node_bytes, guess_edge_bytes = parhip_format(n, upper)
    node_dtype = np.uint32 if node_bytes == 4 else np.uint64
    guess_base = PARHIP_HEADER_BYTES + (n + 1) * guess_edge_bytes
    entry_bytes = 4 if n < 2**31 else 8
    tmp = path + '.tmp'
    num_ranges, m = 0, 0
    try:
        with open(tmp, 'w+b') as f:
            f.seek(guess_base)
            for r0, r1 in row_ranges(deg, budget_bytes, entry_bytes):
                col = symmetric_rows(source, r0, r1, deg[r0:r1], chunk_edges)
                f.write(col.numpy().astype(node_dtype, copy=False).tobytes())
                m += col.numel()
                num_ranges += 1
                del col
            version, _, edge_bytes = parhip_format(n, m)
            base = PARHIP_HEADER_BYTES + (n + 1) * edge_bytes
            if base != guess_base:  # duplicates brought the file below 4 GiB
                _shift_left(f, guess_base, base, m * node_bytes)
            f.seek(0)
            f.write(np.array([version, n, m], dtype=np.uint64).tobytes())
            _write_offsets(f, deg, base, node_bytes, edge_bytes)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return {'num_nodes': n, 'num_entries': m, 'num_ranges': num_ranges,
            'budget_bytes': budget_bytes}


def _write_offsets(f, deg: Tensor, base: int, node_bytes: int,
                   edge_bytes: int) -> None:
    r"""The :obj:`n + 1` offsets (byte positions of every row's neighbors)
    from the deduplicated degrees, a block at a time."""
    edge_dtype = np.uint32 if edge_bytes == 4 else np.uint64
    f.write(np.array([base], dtype=edge_dtype).tobytes())
    total = 0
    for lo in range(0, deg.numel(), _PLAN_BLOCK):
        ends = torch.cumsum(deg[lo:lo + _PLAN_BLOCK], dim=0) + total
        total = int(ends[-1])
        f.write((ends * node_bytes + base).numpy().astype(edge_dtype)
                .tobytes())
        del ends


def _shift_left(f, source: int, target: int, length: int,
                block: int = 1 << 26) -> None:
    r"""Moves :obj:`length` bytes of the open file :obj:`f` from offset
    :obj:`source` to the lower offset :obj:`target` (front to back, so no
    byte is overwritten before it is read) and truncates the rest."""
    for done in range(0, length, block):
        f.seek(source + done)
        data = f.read(min(block, length - done))
        f.seek(target + done)
        f.write(data)
    f.truncate(target + length)


def parhip_bytes_bound(num_nodes: int, num_edges: int) -> int:
    r"""An upper bound on the size of the ParHIP file of a graph of
    :obj:`num_edges` directed edges: every edge in both directions."""
    entries = 2 * int(num_edges)
    _, node_bytes, edge_bytes = parhip_format(num_nodes, entries)
    return PARHIP_HEADER_BYTES + (num_nodes + 1) * edge_bytes + \
        entries * node_bytes


__all__ = ['write_symmetric_parhip', 'row_ranges', 'default_budget',
           'parhip_bytes_bound', 'DEFAULT_BYTES_PER_EDGE',
           'MIN_BUDGET_BYTES']
