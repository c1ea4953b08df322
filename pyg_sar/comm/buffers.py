"""Reuse of the exchange buffers of one propagation (CPU).

A SAR propagation moves every halo row through freshly allocated buffers:
the rows a worker gathers to send, the rows it receives, the gradients it
computes for a peer and those it receives back. On CPU each such buffer
above glibc's mmap threshold (which :mod:`pyg_sar.utils.malloc` fixes at 2 MiB)
is a new mapping whose every page the kernel faults in and zeroes on first
touch, and unmaps on free. At 4 workers on the 200k-node benchmark graph
that was ~390 MiB of freshly faulted pages per worker and epoch, a third of
all it allocated, and the extra system time made 4 workers slower than one.

Inside :func:`reusing_buffers` (the engine opens it around the forward
and the backward of each propagation), :func:`empty` hands out a buffer
that a previous step of the same propagation let go, when one is large
enough, instead of a new one. A buffer counts as let go
only when nothing but this pool holds its storage (not a view, not
autograd, not an in-flight send or receive of the transport), by torch's
storage use count; that count is calibrated at import (a view must add
one), and where it is missing or behaves otherwise nothing is reused. So a
reused buffer can never be one somebody still reads. When the outermost
scope closes, the pool drops its references: no memory is held between
propagations, so the peak of the epoch is not raised. Buffers come back
uninitialized; callers overwrite them whole. CUDA tensors are never pooled
(the caching allocator already reuses them), nor is anything outside a
scope. The pool is per thread.

On the sparse linear path halo slices make the buffers of successive
steps the same size. Attention and general messages exchange each peer's
whole table, so successive buffers differ in size (a new one is made
``_SLACK`` larger, so that the next peers' tables fit): the pool saves the
system time of faulting in fresh pages at every step, and the buffers it
holds between steps stay within a propagation, so the epoch's peak barely
moves.
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from pyg_sar.comm.state import STATS, config

# A new buffer is this much larger than asked for, so that the similar but
# not equal tables of the next peers fit in it (pages never written are
# never faulted in, so the slack costs no memory).
_SLACK = 1.125


class _Pool(threading.local):
    def __init__(self) -> None:
        self.depth = 0
        self.buffers: List[Tensor] = []  # flat uint8 bases


_POOL = _Pool()


# How many references a storage has; without it nothing is reused.
_USE_COUNT = getattr(torch._C, '_storage_Use_Count', None)


def _count(t: Tensor) -> int:
    return _USE_COUNT(t.untyped_storage()._cdata)


def _count_alone() -> Optional[int]:
    """The count of a storage held by one tensor only, as this torch
    reports it (the temporary storage object of the call may count too);
    ``None``, so nothing is reused, unless a view then counts one more."""
    if _USE_COUNT is None:
        return None
    try:
        t = torch.empty(1)
        alone = _count(t)
        view = t[:]
        with_view = _count(t)
        del view
        return alone if with_view == alone + 1 else None
    except Exception:  # a private API: any change turns reuse off
        return None


_ALONE = _count_alone()


def _unused(base: Tensor) -> bool:
    """Whether only the pool's own tensor holds ``base``'s storage."""
    return _count(base) == _ALONE


@contextlib.contextmanager
def reusing_buffers(enabled: bool = True) -> Iterator[None]:
    """Pools the exchange buffers of everything inside (nestable; the pool
    is emptied when the outermost scope ends); ``enabled=False`` does
    nothing."""
    if not enabled:
        yield
        return
    _POOL.depth += 1
    try:
        yield
    finally:
        _POOL.depth -= 1
        if _POOL.depth == 0:
            _POOL.buffers = []


def empty(shape: Sequence[int], dtype: torch.dtype,
          device: torch.device) -> Tensor:
    """An uninitialized tensor, from the pool inside :func:`reusing_buffers`
    on CPU (the smallest let-go buffer that fits) for buffers of at least
    ``reuse_buffers_from`` bytes (:class:`~pyg_sar.comm.CommConfig`), else
    new."""
    device = torch.device(device)
    nbytes = math.prod(shape) * dtype.itemsize
    if (_POOL.depth == 0 or device.type != 'cpu' or not config().reuse_buffers
            or _ALONE is None or nbytes == 0
            or nbytes < config().reuse_buffers_from):
        return torch.empty(shape, dtype=dtype, device=device)
    free = [b for b in _POOL.buffers if _unused(b)]
    fits = [b for b in free if b.numel() >= nbytes]
    if fits:
        base = min(fits, key=Tensor.numel)
        STATS['buffers_reused'] += 1
    else:
        # Let-go buffers too small for this one would only be held: drop
        # them before mapping a new one.
        held = {id(b) for b in free}
        _POOL.buffers = [b for b in _POOL.buffers if id(b) not in held]
        base = torch.empty(int(nbytes * _SLACK) + 64, dtype=torch.uint8,
                           device=device)
        _POOL.buffers.append(base)
    # The start of a fresh allocation is aligned for every dtype.
    return base[:nbytes].view(dtype).view(shape)


def rows_shape(num_rows: int, row: Sequence[int],
               heads_first: bool = False) -> Tuple[int, ...]:
    """The shape of ``num_rows`` rows shaped ``row``; head-major
    (``[H, num_rows, C]`` for rows ``[H, C]``) with ``heads_first``."""
    if heads_first:
        return (row[0], num_rows, *row[1:])
    return (num_rows, *row)


def gather_rows(table: Tensor, index: Tensor,
                heads_first: bool = False) -> Tensor:
    """Rows ``index`` of ``table`` (what a worker sends), into a buffer of
    :func:`empty`; with ``heads_first``, head-major (``[H, rows, C]`` for a
    table ``[N, H, C]``)."""
    out = empty(rows_shape(int(index.numel()), table.shape[1:], heads_first),
                table.dtype, table.device)
    if not heads_first:
        return torch.index_select(table, 0, index, out=out)
    # Head by head: index_select along dim 1 of the transposed table would
    # first copy the whole table head-major (9x slower, a table-sized
    # temporary).
    for h in range(table.shape[1]):
        torch.index_select(table[:, h], 0, index, out=out[h])
    return out
