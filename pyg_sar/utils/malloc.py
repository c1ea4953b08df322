"""The C allocator settings of a training worker (glibc ``mallopt``).

PyTorch's CPU tensors come straight from ``malloc``. glibc serves blocks
above its mmap threshold with ``mmap`` (returned to the OS on ``free``) and
smaller ones from heap arenas, whose freed pages stay resident until the top
of the heap is trimmed. The threshold is dynamic by default: after the first
free of an mmap'ed block of size s (up to 32 MiB), blocks up to s come from
the heap for the rest of the process. A full-batch epoch frees and
reallocates many node- and edge-sized temporaries of a few MiB to tens of
MiB, so with the dynamic threshold the resident set grows to the largest
set of such blocks ever alive plus the holes between them, instead of
tracking the live tensors.

:func:`configure_allocator` fixes the threshold at 2 MiB, which also
turns off the dynamic adjustment: node- and edge-sized temporaries then go
back to the OS when freed, while small per-chunk temporaries (an attention
chunk's ``[edges, heads]`` scores are 1 MiB) are reused from the heap. The
threshold is absolute while node-sized blocks shrink with the worker count:
a higher one serves a many-worker run's node-sized blocks from the heap,
whose holes then raise its peak, while one worker on the whole graph maps
the same blocks and gives them back. A per-chunk buffer above it is mapped
and faulted in anew on every use, so the engine builds none (the attention
backward adds each chunk's per-head products in place into its gradient).
It also caps the heap arenas at 4. :class:`pyg_sar.DistGraph` and
:func:`pyg_sar.init_distributed` call it once per process, so no environment
variable (``MALLOC_MMAP_THRESHOLD_``) is needed; the DistGraph also returns
its set-up temporaries to the OS (:func:`release_free_memory`). A process
that set any ``MALLOC_*`` variable keeps its own choice;
``PYG_SAR_MALLOC=default`` keeps glibc's, ``PYG_SAR_MALLOC=<bytes>`` sets
another threshold. Elsewhere than glibc it does nothing.
"""
from __future__ import annotations

import ctypes
import functools
import ctypes.util
import os
from typing import Optional

_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

_configured: Optional[bool] = None
MMAP_THRESHOLD = 2 << 20


@functools.lru_cache(maxsize=None)
def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
        return libc if hasattr(libc, 'mallopt') else None
    except OSError:
        return None


def limit_heap_retention(threshold_bytes: int = 1 << 20) -> bool:
    """Fixes glibc's mmap threshold at ``threshold_bytes``, so that freed
    blocks above it go back to the OS at once. Returns False where the C
    library is not glibc."""
    libc = _libc()
    return bool(libc and libc.mallopt(_M_MMAP_THRESHOLD,
                                      int(threshold_bytes)))


def configure_allocator() -> bool:
    """Applies the worker's allocator settings once per process (see the
    module docstring); returns whether they are in effect."""
    global _configured
    if _configured is not None:
        return _configured
    _configured = False
    if os.environ.get('PYG_SAR_MALLOC', '').lower() == 'default' or any(
            key.startswith('MALLOC_') for key in os.environ):
        return _configured
    libc = _libc()
    if libc is None:
        return _configured
    setting = os.environ.get('PYG_SAR_MALLOC', '')
    threshold = int(setting) if setting.isdigit() else MMAP_THRESHOLD
    _configured = True
    if threshold:
        _configured = bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
    # Arenas beyond the threads in use only add holes (4 covers the
    # intra-op pool of a worker on a few cores and the comm threads).
    libc.mallopt(_M_ARENA_MAX, 4)
    return _configured


def release_free_memory() -> bool:
    """Returns the free pages of every heap arena to the OS
    (``malloc_trim(0)``), e.g. the temporaries of a set-up step."""
    libc = _libc()
    if libc is None or not hasattr(libc, 'malloc_trim'):
        return False
    return bool(libc.malloc_trim(0))


def trim_heap() -> None:
    """:func:`release_free_memory` where the worker's allocator policy is in
    effect (:func:`configure_allocator`): the SAR engine calls it after each
    propagation's forward and backward, so the freed per-chunk temporaries
    of one layer (below the mmap threshold, hence from the heap) are not
    still resident at the peak of another."""
    if _configured:
        release_free_memory()
