"""What the device a worker computes on can hold, and the engine's default
edge budget derived from it.

The SAR engine cuts every non-linear propagation into edge chunks whose
temporaries fit a budget (:class:`~pyg_sar.comm.CommConfig`'s
``edge_memory_budget``). The right size depends on the device: on a CPU a
chunk should stay near the caches, on a GPU it should be large enough that
its kernels, not their launches, set the pace, and small against the free
memory. :func:`default_edge_budget` picks it from :func:`device_capacity`;
:func:`set_device_capacity` injects a capacity (tests, or a user who knows
better than the probe).
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Dict, Optional

import torch

MiB = 1 << 20
GiB = 1 << 30

#: CPU budget bounds: a chunk stays within half the last-level cache, but
#: never so small that per-chunk overhead dominates, nor larger than this.
CPU_BUDGET_MIN, CPU_BUDGET_MAX = 4 * MiB, 64 * MiB
#: Without a readable cache size (no sysfs): the budget tuned on a 32 MiB L3.
CPU_FALLBACK_CACHE = 32 * MiB
#: GPU budget: a sixteenth of the free memory at first use, at most this
#: (past about this size per chunk the engine's kernels no longer get
#: faster on an H100/H200; ``benchmarks/device_check.py`` sweeps it).
GPU_FREE_FRACTION = 16
GPU_BUDGET_MAX = 1 * GiB
GPU_BUDGET_MIN = 64 * MiB


@dataclass(frozen=True)
class DeviceCapacity:
    """What sizes the engine's chunks on one device.

    Args:
        kind: ``'cpu'`` or ``'cuda'``.
        cache_bytes: The last-level cache (CPU), or the L2 (CUDA).
        free_bytes: Free device memory (CUDA; ``None`` on the CPU).
    """
    kind: str
    cache_bytes: int
    free_bytes: Optional[int] = None


_INJECTED: Dict[str, DeviceCapacity] = {}
_PROBED: Dict[str, DeviceCapacity] = {}


def set_device_capacity(capacity: Optional[DeviceCapacity],
                        kind: str = 'cpu') -> None:
    """Makes :func:`device_capacity` answer ``capacity`` for devices of
    ``kind`` (``None``: probe the device again)."""
    if capacity is None:
        _INJECTED.pop(kind, None)
    else:
        if capacity.kind != kind:
            raise ValueError(f"capacity of kind {capacity.kind!r} given for "
                             f"devices of kind {kind!r}")
        _INJECTED[kind] = capacity
    _PROBED.pop(kind, None)


def device_capacity(device: torch.device) -> DeviceCapacity:
    """The capacity of ``device``: an injected one, else probed once per
    device (so that chunk sizes, and float rounding, stay the same for the
    whole process)."""
    device = torch.device(device)
    if device.type in _INJECTED:
        return _INJECTED[device.type]
    key = str(device)
    if key not in _PROBED:
        _PROBED[key] = _probe(device)
    return _PROBED[key]


def default_edge_budget(device: torch.device) -> int:
    """Bytes of per-chunk temporaries the engine spends by default on
    ``device``: half the last-level cache on a CPU (4 to 64 MiB); on a GPU a
    sixteenth of its free memory at first use (64 MiB to 1 GiB). A power of
    two, so that layers of similar widths cut blocks alike."""
    cap = device_capacity(device)
    if cap.kind == 'cuda':
        free = cap.free_bytes if cap.free_bytes is not None else 16 * GiB
        budget = min(GPU_BUDGET_MAX,
                     max(GPU_BUDGET_MIN, free // GPU_FREE_FRACTION))
    else:
        budget = min(CPU_BUDGET_MAX, max(CPU_BUDGET_MIN,
                                         cap.cache_bytes // 2))
    return power_of_two_at_most(budget)


def power_of_two_at_most(n: int) -> int:
    """The largest power of two not above ``n`` (at least 1): chunk and
    slice sizes are rounded down to one, so that layers of similar widths
    cut blocks alike and share one set of cached cuts."""
    return 1 << (max(int(n), 1).bit_length() - 1)


def _probe(device: torch.device) -> DeviceCapacity:
    if device.type == 'cuda':
        index = device.index if device.index is not None else \
            torch.cuda.current_device()
        free, _ = torch.cuda.mem_get_info(index)
        props = torch.cuda.get_device_properties(index)
        return DeviceCapacity('cuda', int(getattr(props, 'L2_cache_size', 0)),
                              int(free))
    return DeviceCapacity('cpu', _last_level_cache())


def _last_level_cache() -> int:
    """The largest data or unified cache of CPU 0 (sysfs), in bytes."""
    best_level, best = -1, 0
    for folder in glob.glob('/sys/devices/system/cpu/cpu0/cache/index*'):
        try:
            with open(os.path.join(folder, 'type')) as f:
                if f.read().strip() == 'Instruction':
                    continue
            with open(os.path.join(folder, 'level')) as f:
                level = int(f.read())
            with open(os.path.join(folder, 'size')) as f:
                size = _parse_size(f.read().strip())
        except (OSError, ValueError):
            continue
        if level > best_level or (level == best_level and size > best):
            best_level, best = level, size
    return best or CPU_FALLBACK_CACHE


def _parse_size(text: str) -> int:
    units = {'K': 1 << 10, 'M': MiB, 'G': GiB}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)
