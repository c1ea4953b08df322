"""Joining the process group (:func:`init_distributed`), this worker's place
in it, and leaving it (:func:`destroy_groups`, also at interpreter exit)."""
from __future__ import annotations

import atexit
import os
import socket
from datetime import timedelta
from typing import Callable, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_sar.comm.state import configure


def find_free_port() -> int:
    """A free TCP port on the loopback interface (for local launches)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def init_distributed(
    backend: Optional[str] = None,
    timeout: timedelta = timedelta(minutes=5),
    device: Optional[str] = None,
) -> Tuple[int, int]:
    """Joins the process group described by the ``torchrun`` environment.

    Reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
    ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``. Without them (a plain
    ``python script.py``) it runs as a single worker with no process group.
    ``timeout`` bounds every collective wait of the package. Under a
    process group, an uncaught error of this worker is recorded for the
    launcher (:mod:`pyg_sar.comm.errors`): torchrun then names this rank
    as the root cause rather than a peer that only saw it die.

    ``backend=None`` picks it from where the worker's tensors live
    (:func:`pick_backend`): ``nccl`` when they are on CUDA and every local
    rank has a GPU of its own, ``gloo`` otherwise: a CPU job on any machine
    (``device='cpu'``), or more local ranks than GPUs, which then share the
    GPUs (local rank ``r`` uses GPU ``r % num_gpus``; CUDA tensors are staged
    through host memory for every exchange). An explicit ``'nccl'`` with
    more local ranks than GPUs is refused: NCCL needs one GPU per rank.

    Args:
        backend: ``'gloo'``, ``'nccl'``, ``'mpi'`` or ``None`` (pick).
        timeout: Longest wait of any collective.
        device: Where this worker's tensors live: ``'cpu'``, ``'cuda'`` or
            ``None``/``'auto'`` (CUDA where available).

    Returns:
        ``(rank, world_size)``
    """
    configure(timeout=timeout)
    from pyg_sar.utils.malloc import configure_allocator
    configure_allocator()  # RSS tracks live tensors (pyg_sar/utils/malloc.py)
    if dist.is_available() and dist.is_initialized():
        _destroy_groups_at_exit()
        return dist.get_rank(), dist.get_world_size()
    env = os.environ
    if 'WORLD_SIZE' not in env or 'RANK' not in env:
        return 0, 1
    try:
        rank, world_size = int(env['RANK']), int(env['WORLD_SIZE'])
    except ValueError as e:
        raise ValueError(f"RANK={env.get('RANK')!r} and WORLD_SIZE="
                         f"{env.get('WORLD_SIZE')!r} must be integers") from e
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK={rank} must lie in [0, WORLD_SIZE="
                         f"{world_size})")
    for key in ('MASTER_ADDR', 'MASTER_PORT'):
        if key not in env:
            raise ValueError(f"{key} is not set; launch with torchrun or set "
                             f"it (e.g. MASTER_ADDR=127.0.0.1)")
    local_rank = int(env.get('LOCAL_RANK', rank))
    local_world = int(env.get('LOCAL_WORLD_SIZE', world_size))
    num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = pick_backend(backend, device, num_gpus, local_world)
    if num_gpus and device_type(device) == 'cuda':
        # Several local ranks per GPU share it (gloo stages their tensors).
        torch.cuda.set_device(local_rank % num_gpus)
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=timeout, store=_restart_store(timeout))
    _destroy_groups_at_exit()
    for joined in _AFTER_INIT:  # (pyg_sar.comm.errors' failure hook)
        joined()
    return rank, world_size


# What runs once this worker has joined a process group: registered by the
# package (comm/__init__.py registers the failure hook), so this module
# imports none of them.
_AFTER_INIT: List[Callable[[], None]] = []


def after_init(hook: Callable[[], None]) -> Callable[[], None]:
    """Registers ``hook`` to run when :func:`init_distributed` has joined
    a process group."""
    _AFTER_INIT.append(hook)
    return hook


def device_type(device: Optional[str]) -> str:
    """``'cpu'`` or ``'cuda'``: where a worker asked to use ``device``
    (``None``/``'auto'``: CUDA where available) keeps its tensors."""
    if device is None or str(device) == 'auto':
        return 'cuda' if torch.cuda.is_available() else 'cpu'
    kind = torch.device(device).type
    if kind not in ('cpu', 'cuda'):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]' "
                         f"(got {device!r})")
    return kind


def pick_backend(backend: Optional[str], device: Optional[str],
                 num_gpus: int, local_world_size: int) -> str:
    """The process-group backend for a worker whose tensors live on
    ``device`` on a machine with ``num_gpus`` GPUs and ``local_world_size``
    workers (see :func:`init_distributed`)."""
    if backend is not None and backend not in ('gloo', 'nccl', 'mpi'):
        raise ValueError(f"backend must be 'gloo', 'nccl', 'mpi' or None "
                         f"(got {backend!r})")
    on_cuda = device_type(device) == 'cuda'
    if on_cuda and num_gpus == 0:  # (only a device named 'cuda' gets here)
        raise ValueError(f"device={device!r}: CUDA is not available here")
    if backend == 'nccl' and local_world_size > num_gpus:
        raise ValueError(
            f"backend='nccl' needs one GPU per local rank, but "
            f"LOCAL_WORLD_SIZE={local_world_size} and {num_gpus} GPU(s) are "
            f"visible; use backend='gloo' (ranks share the GPUs, tensors "
            f"staged through host memory) or start at most {num_gpus} "
            f"ranks per machine")
    if backend is not None:
        return backend
    return 'nccl' if on_cuda and local_world_size <= num_gpus else 'gloo'


# Teardown ###################################################################

# What destroys the package's own groups (channels, the control group) before
# the default group goes: registered by the modules that make them.
_BEFORE_TEARDOWN: List[Callable[[], None]] = []
_AT_EXIT = {'registered': False}


def before_teardown(destroy: Callable[[], None]) -> Callable[[], None]:
    """Registers ``destroy`` (which destroys a module's sub-groups and
    forgets them) to run before the default group is destroyed."""
    _BEFORE_TEARDOWN.append(destroy)
    return destroy


def destroy_groups() -> None:
    """Destroys the package's sub-groups, then the default group (local: no
    barrier). Sub-groups go first, while the default group they were made
    from still exists; every group's transport threads are joined here,
    not by static destructors at interpreter exit."""
    try:
        for destroy in _BEFORE_TEARDOWN:
            destroy()
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _destroy_groups_at_exit() -> None:
    """Makes interpreter exit destroy the process groups that are still up
    (registered once). A script that never calls
    :func:`~pyg_sar.comm.shutdown` otherwise leaves gloo's threads to
    static destructors, which abort the finished process in some runs
    ("terminate called without an active exception")."""
    if not _AT_EXIT['registered']:
        atexit.register(_teardown_at_exit)
        _AT_EXIT['registered'] = True


def _teardown_at_exit() -> None:
    # No barrier: a rank that exits on an error must not wait for peers
    # that may never come (they fail fast on the closed connections), and a
    # finished rank has nothing left in flight (its last sends completed).
    try:
        destroy_groups()
    except Exception:  # never turn a finished run into a failure
        pass


def _restart_store(timeout: timedelta):
    """The rendezvous store of a worker group that torchrun restarted.

    torchrun's agent hosts one store for all attempts and hands it to every
    restarted group without a per-attempt prefix, so a restarted worker
    would read the addresses the dead group published (gloo: "connectFullMesh
    failed ... Connection refused"). Each restart gets its own namespace,
    named by ``TORCHELASTIC_RESTART_COUNT``; that count is consistent only
    among the workers of one agent, so this applies to single-node launches
    (``GROUP_WORLD_SIZE`` 1). None (the default ``env://`` rendezvous)
    otherwise.
    """
    env = os.environ
    restart = env.get('TORCHELASTIC_RESTART_COUNT', '0')
    if env.get('TORCHELASTIC_USE_AGENT_STORE') != 'True' or \
            env.get('GROUP_WORLD_SIZE', '1') != '1' or restart == '0':
        return None
    store = dist.TCPStore(env['MASTER_ADDR'], int(env['MASTER_PORT']),
                          int(env['WORLD_SIZE']), is_master=False,
                          timeout=timeout)
    return dist.PrefixStore(f'pyg_sar/restart-{restart}', store)


def is_joined() -> bool:
    """Whether this worker has joined a process group (of any size)."""
    return dist.is_available() and dist.is_initialized()


def is_active() -> bool:
    """Whether this worker is in a process group of more than one rank
    (otherwise every operation is a local no-op)."""
    return dist.is_available() and dist.is_initialized() and \
        dist.get_world_size() > 1


def get_rank() -> int:
    """This worker's rank (0 without a process group)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() \
        else 0


def get_world_size() -> int:
    """The number of workers (1 without a process group)."""
    return dist.get_world_size() if dist.is_available() and \
        dist.is_initialized() else 1


def comm_device(tensor: Tensor) -> Tensor:
    """The tensor on the device the backend moves: the current GPU for
    nccl, the CPU for gloo (which cannot send CUDA tensors point to point);
    the tensor itself where it already lives there."""
    if dist.get_backend() == 'nccl':
        return tensor if tensor.is_cuda else tensor.cuda()
    return tensor if tensor.device.type == 'cpu' else tensor.cpu()
