"""Communication settings and counters, the mutable state of
:mod:`pyg_sar.comm`.

The settings (:func:`config`) and the counters (:data:`STATS`) exist once,
here. The other submodules change them in place, never rebinding them.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Dict, Optional, Union

from pyg_sar.utils.device import default_edge_budget


@dataclass
class CommConfig:
    """Communication knobs shared by the engine and the loaders.

    Args:
        timeout: Longest wait for any single send, receive or collective.
        max_bytes_per_message: Larger tensors are split into several
            messages of at most this many bytes, which bounds the staging
            memory of the transport.
        pipeline_depth: How many ring rounds ahead the SAR engine posts its
            exchanges while it aggregates the current round (0 disables
            prefetching; each extra round costs one halo block of memory).
        edge_memory_budget: Bytes the SAR engine may spend on per-edge
            temporaries (gathered features, messages) of non-linear layers;
            blocks are cut into edge chunks that fit, even without a
            ``chunk_size``. ``None`` (the default) fits the device the
            propagation runs on (:func:`pyg_sar.utils.device.default_edge_budget`:
            half the last-level cache on a CPU, a sixteenth of the free
            memory, at most 1 GiB, on a GPU). A worker whose node-sized table of the layer
            (its nodes times the widest row read) is smaller spends at most
            that table (and at least 1 MiB), so the temporaries fall with
            the worker's share of the graph. Linear layers run as sparse
            products and need none.
        halo_slice_bytes: On its sparse linear path (sum or mean of
            ``w_e * x_j``: SAGE, GCN, GIN, GraphConv) the SAR engine fetches
            a peer's source rows, and returns their gradients, in slices of
            at most about this many bytes, each aggregated before the next
            arrives, so the halo memory in flight stays a few slices
            whatever the partition's cut (0: one exchange per peer). Every
            rank must use the same value.
        reuse_buffers: Within one propagation, reuse the CPU exchange
            buffers a step let go for later steps instead of faulting in
            fresh pages every step (:mod:`pyg_sar.comm.buffers`).
        reuse_buffers_from: The smallest buffer (bytes) that is reused;
            smaller ones come from malloc's heap, which reuses them itself.

    The settings of :data:`SHARED_SETTINGS` shape the messages themselves
    (how a tensor is cut into messages, which rows one exchange moves), so
    every rank must use the same values; :mod:`pyg_sar.comm.agreement`
    compares them across ranks before any message they shape is posted and
    refuses a difference with a :class:`~pyg_sar.comm.SettingsMismatchError`
    on every rank. The others are local: ``timeout`` bounds this rank's
    waits, ``pipeline_depth`` only changes when this rank posts (each pair of
    ranks still posts its exchanges in the same order), and the edge budget
    and buffer reuse only change this rank's memory.
    """
    timeout: timedelta = timedelta(minutes=5)
    max_bytes_per_message: int = 256 * 1024 * 1024
    pipeline_depth: int = 1
    edge_memory_budget: Optional[int] = None
    halo_slice_bytes: int = 8 * 1024 * 1024
    reuse_buffers: bool = True
    reuse_buffers_from: int = 1024 * 1024

    def budget_for(self, device) -> int:
        """:attr:`edge_memory_budget`, or where it is ``None`` the default
        of ``device`` (:func:`~pyg_sar.utils.device.default_edge_budget`)."""
        if self.edge_memory_budget is not None:
            return self.edge_memory_budget
        return default_edge_budget(device)

    def edge_budget(self, num_nodes: int, row_bytes: int,
                    device='cpu') -> int:
        """Bytes one propagation over a worker of ``num_nodes`` nodes on
        ``device`` may spend on per-chunk temporaries when the widest row it
        reads has ``row_bytes``: :meth:`budget_for` the device, and at most
        one node-sized table of such rows (at least 1 MiB)."""
        table = int(num_nodes) * int(row_bytes)
        return min(self.budget_for(device), max(1 << 20, table))


#: The :class:`CommConfig` fields every rank must share (see there).
SHARED_SETTINGS = ('max_bytes_per_message', 'halo_slice_bytes')

_CONFIG = CommConfig()
#: The live counters of :func:`comm_stats`, which the operations of
#: :mod:`pyg_sar.comm` increase.
STATS: Dict[str, int] = {}


def reset_comm_stats() -> None:
    """Zeroes the counters reported by :func:`comm_stats`."""
    STATS.update(bytes_sent=0, bytes_received=0, messages_sent=0,
                 messages_received=0, collectives=0, buffers_reused=0)


reset_comm_stats()


def comm_stats(reset: bool = False) -> Dict[str, int]:
    """Bytes and messages this rank sent and received, the number of
    collective calls (exchanges and reductions) and of exchange buffers
    reused (:mod:`pyg_sar.comm.buffers`), since the last reset.

    Args:
        reset: Zero the counters after reading them.
    """
    stats = dict(STATS)
    if reset:
        reset_comm_stats()
    return stats


def config() -> CommConfig:
    """The active :class:`CommConfig` (mutable)."""
    return _CONFIG


def configure(timeout: Optional[timedelta] = None,
              max_bytes_per_message: Optional[int] = None,
              pipeline_depth: Optional[int] = None,
              edge_memory_budget: Union[int, str, None] = None,
              halo_slice_bytes: Optional[int] = None,
              reuse_buffers: Optional[bool] = None,
              reuse_buffers_from: Optional[int] = None) -> CommConfig:
    """Changes the settings of :class:`CommConfig`; ``None`` keeps one.

    Local and cheap: it may be called before the process group exists or on
    one rank only. A change of a shared setting (:data:`SHARED_SETTINGS`) is
    compared across ranks by the next operation of :mod:`pyg_sar.comm` (one
    tiny collective); call it on every rank at the same point of the
    program, with the same values. ``edge_memory_budget='auto'`` returns
    to the device's default."""
    if edge_memory_budget == 'auto':
        _CONFIG.edge_memory_budget = None
        edge_memory_budget = None
    if timeout is not None:
        _CONFIG.timeout = timeout
    if reuse_buffers is not None:
        _CONFIG.reuse_buffers = bool(reuse_buffers)
    for name, value, minimum in (
            ('max_bytes_per_message', max_bytes_per_message, 1),
            ('pipeline_depth', pipeline_depth, 0),
            ('edge_memory_budget', edge_memory_budget, 1),
            ('halo_slice_bytes', halo_slice_bytes, 0),
            ('reuse_buffers_from', reuse_buffers_from, 0)):
        if value is None:
            continue
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum} (got {value})")
        setattr(_CONFIG, name, int(value))
    return _CONFIG
