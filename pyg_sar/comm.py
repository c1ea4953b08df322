"""All inter-worker communication of pyg_sar lives in this module.

Every ``torch.distributed`` call of the package goes through here, so that
bytes and messages can be counted in one place (:func:`comm_stats`), every wait
has a timeout, and a dead or hung peer becomes a :class:`PeerError` naming the
rank instead of an endless wait.

With a world size of 1 (or no process group at all) every function is a cheap
local no-op, so the same model code runs on one machine.
"""
from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    'CommConfig', 'PeerError', 'init_distributed', 'get_rank',
    'get_world_size', 'configure', 'config', 'comm_stats',
    'reset_comm_stats', 'all_reduce', 'all_gather_object', 'broadcast_',
    'all_to_all_v', 'post_exchange', 'PendingExchange', 'sync_params',
    'all_reduce_grads', 'global_count', 'barrier', 'find_free_port',
    'ddp_sum_hook', 'global_sum', 'save_replicated', 'load_replicated',
    'replicated_specs',
]


class PeerError(RuntimeError):
    """A peer died, hung past the timeout, or disagreed about the plan.

    Besides the message, the fields say what failed (``None`` where
    unknown):

    Attributes:
        rank: This worker's rank.
        operation: ``'send'``, ``'receive'`` or the collective
            (``'all_reduce(sum)'``, ``'barrier'``, ...).
        peer: The peer's rank: the other side of a send or receive; for a
            collective, the other rank of a world of two, or a rank the
            transport's error names.
        address: The peer's ``host:port`` where the transport's error names
            it (gloo does for closed and reset connections).
        elapsed: Seconds the failed wait really lasted (a peer that died
            fails a wait at once, long before the timeout).
        timeout: The configured timeout in seconds.
        timed_out: Whether the wait ran into the timeout (rather than
            failing early, e.g. on a closed connection).
    """

    _FIELDS = ('rank', 'operation', 'peer', 'address', 'elapsed', 'timeout',
               'timed_out')

    def __init__(self, message: str, **fields) -> None:
        super().__init__(message)
        unknown = set(fields) - set(self._FIELDS)
        if unknown:
            raise TypeError(f"PeerError got unknown fields {sorted(unknown)}")
        for name in self._FIELDS:
            setattr(self, name, fields.get(name))

    def __reduce__(self):  # keep the fields through pickling
        return (_rebuild_peer_error,
                (str(self), {n: getattr(self, n) for n in self._FIELDS}))


def _rebuild_peer_error(message: str, fields: Dict) -> PeerError:
    return PeerError(message, **fields)


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
            ``chunk_size``. Linear layers run as sparse products and need
            none.
    """
    timeout: timedelta = timedelta(minutes=5)
    max_bytes_per_message: int = 256 * 1024 * 1024
    pipeline_depth: int = 1
    edge_memory_budget: int = 16 * 1024 * 1024


_CONFIG = CommConfig()
_STATS: Dict[str, int] = {}


def reset_comm_stats() -> None:
    """Zeroes the counters reported by :func:`comm_stats`."""
    _STATS.update(bytes_sent=0, bytes_received=0, messages_sent=0,
                  messages_received=0, collectives=0)


reset_comm_stats()


def comm_stats(reset: bool = False) -> Dict[str, int]:
    """Bytes and messages this rank sent and received, and the number of
    collective calls (exchanges and reductions), since the last reset.

    Args:
        reset: Zero the counters after reading them.
    """
    stats = dict(_STATS)
    if reset:
        reset_comm_stats()
    return stats


def config() -> CommConfig:
    """The active :class:`CommConfig` (mutable)."""
    return _CONFIG


def configure(timeout: Optional[timedelta] = None,
              max_bytes_per_message: Optional[int] = None,
              pipeline_depth: Optional[int] = None,
              edge_memory_budget: Optional[int] = None) -> CommConfig:
    """Changes the settings of :class:`CommConfig`; ``None`` keeps one."""
    if timeout is not None:
        _CONFIG.timeout = timeout
    for name, value, minimum in (
            ('max_bytes_per_message', max_bytes_per_message, 1),
            ('pipeline_depth', pipeline_depth, 0),
            ('edge_memory_budget', edge_memory_budget, 1)):
        if value is None:
            continue
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum} (got {value})")
        setattr(_CONFIG, name, int(value))
    return _CONFIG


# Process group ###############################################################

def find_free_port() -> int:
    """A free TCP port on the loopback interface (for local launches)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def init_distributed(
    backend: Optional[str] = None,
    timeout: timedelta = timedelta(minutes=5),
) -> Tuple[int, int]:
    """Joins the process group described by the ``torchrun`` environment.

    Reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and
    ``LOCAL_RANK``. Without them (a plain ``python script.py``) it runs as a
    single worker with no process group. ``backend=None`` picks ``nccl`` when
    CUDA is available and ``gloo`` otherwise. ``timeout`` bounds every
    collective wait of the package.

    Returns:
        ``(rank, world_size)``
    """
    configure(timeout=timeout)
    if dist.is_available() and dist.is_initialized():
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
    if backend is None:
        backend = 'nccl' if torch.cuda.is_available() else 'gloo'
    if backend not in ('gloo', 'nccl', 'mpi'):
        raise ValueError(f"backend must be 'gloo', 'nccl' or 'mpi' "
                         f"(got {backend!r})")
    if backend == 'nccl':
        torch.cuda.set_device(int(env.get('LOCAL_RANK', rank)))
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=timeout, store=_restart_store(timeout))
    return rank, world_size


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


def _active() -> bool:
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


def _comm_device(tensor: Tensor) -> Tensor:
    """gloo moves CPU tensors; nccl needs them on the current GPU."""
    if dist.get_backend() == 'nccl' and not tensor.is_cuda:
        return tensor.cuda()
    return tensor


def _wait(work, what: str, peer: Optional[int] = None) -> None:
    timeout = _CONFIG.timeout
    start = time.perf_counter()
    try:
        ok = work.wait(timeout)
    except Exception as e:  # gloo raises on closed sockets and timeouts
        raise _peer_error(what, peer, e,
                          time.perf_counter() - start) from e
    if ok is False:
        raise _peer_error(what, peer, None, time.perf_counter() - start)


# What transports say in their errors. gloo: "[.../pair.cc:537] Read error
# [127.0.0.1]:56218: Connection reset by peer. This is typically caused
# by ...", "Connection closed by peer [127.0.0.1]:14503. ...", "[...] Timed
# out waiting 4000ms for recv operation to complete", "Operation timed out!".
_SOURCE_PREFIX = re.compile(r'^\[[^\]]*\.(?:cc|cpp|cu|h|hpp):\d+\]\s*')
_ADDRESS = re.compile(r'\[([0-9A-Za-z_.:%-]+)\]:(\d+)')
_NAMED_RANKS = re.compile(r'\branks?\s*[=:]?\s*(\d+(?:\s*,\s*\d+)*)',
                          re.IGNORECASE)
_TIMED_OUT = re.compile(r'timed?\s*out', re.IGNORECASE)
_POINT_TO_POINT = {'send': 'to', 'receive': 'from'}


def _transport_summary(cause: BaseException) -> str:
    """The first sentence of a transport error, without gloo's source
    location and boilerplate advice (the full text stays chained)."""
    lines = str(cause).strip().splitlines()
    text = _SOURCE_PREFIX.sub('', lines[0]) if lines else ''
    text = text.split('. This is typically caused by')[0].strip()
    return text or type(cause).__name__


def _peer_error(what: str, peer: Optional[int],
                cause: Optional[BaseException],
                elapsed: float) -> PeerError:
    """Builds the :class:`PeerError` of a failed wait of ``elapsed`` seconds
    on ``what`` (a send/receive with ``peer``, or a collective)."""
    rank, world_size = get_rank(), get_world_size()
    timeout = _CONFIG.timeout.total_seconds()
    text = str(cause) if cause is not None else ''
    address = None
    match = _ADDRESS.search(text)
    if match:
        address = f'{match.group(1)}:{match.group(2)}'
    named = sorted({int(r) for m in _NAMED_RANKS.finditer(text)
                    for r in re.split(r'\s*,\s*', m.group(1))} - {rank})
    point_to_point = what in _POINT_TO_POINT
    if point_to_point:
        target = f'{what} {_POINT_TO_POINT[what]} rank {peer}'
    elif world_size == 2:
        peer = 1 - rank
        target = f'{what} with rank {peer} (the only other rank)'
    else:
        if len(named) == 1:
            peer = named[0]
        target = f'{what} across {world_size} ranks'
    timed_out = cause is None or bool(_TIMED_OUT.search(text)) or \
        elapsed >= 0.95 * timeout
    if peer is not None:
        subject, clue = f'rank {peer}', ''
    elif named:  # several ranks named by the transport
        subject = 'one of ranks ' + ', '.join(map(str, named))
        clue = ' (named by the transport)'
    else:
        subject = 'a peer rank'
        clue = f' (the one at {address})' if address is not None else ''
    outcome = 'timed out' if timed_out else 'failed'
    verdict = 'has probably hung or died' if timed_out else \
        'has probably died'
    detail = f': {_transport_summary(cause)}' if cause is not None else ''
    return PeerError(
        f"rank {rank}: {target} {outcome} after {elapsed:.2f}s (timeout "
        f"{timeout:g}s); {subject}{clue} {verdict}{detail}",
        rank=rank, operation=what, peer=peer, address=address,
        elapsed=elapsed, timeout=timeout, timed_out=timed_out)


# Collectives ################################################################

def barrier() -> None:
    """Waits for every rank, with the configured timeout."""
    if not _active():
        return
    _STATS['collectives'] += 1
    _wait(dist.barrier(async_op=True), 'barrier')


def all_reduce(tensor: Tensor, op: str = 'sum') -> Tensor:
    """In-place all-reduce of ``tensor`` (``'sum'``, ``'max'`` or ``'min'``)."""
    if not _active():
        return tensor
    reduce_op = {'sum': dist.ReduceOp.SUM, 'max': dist.ReduceOp.MAX,
                 'min': dist.ReduceOp.MIN}[op]
    buf = _comm_device(tensor)
    _STATS['collectives'] += 1
    nbytes = buf.numel() * buf.element_size()
    _STATS['bytes_sent'] += nbytes
    _STATS['bytes_received'] += nbytes
    _wait(dist.all_reduce(buf, op=reduce_op, async_op=True),
          f'all_reduce({op})')
    if buf is not tensor:
        tensor.copy_(buf)
    return tensor


def broadcast_(tensor: Tensor, src: int = 0) -> Tensor:
    """In-place broadcast of ``tensor`` from rank ``src``."""
    if not _active():
        return tensor
    buf = _comm_device(tensor)
    _STATS['collectives'] += 1
    nbytes = buf.numel() * buf.element_size()
    if get_rank() == src:
        _STATS['bytes_sent'] += nbytes
    else:
        _STATS['bytes_received'] += nbytes
    _wait(dist.broadcast(buf, src=src, async_op=True),
          f'broadcast(from rank {src})')
    if buf is not tensor:
        tensor.copy_(buf)
    return tensor


class _GlobalSum(torch.autograd.Function):
    """``y = sum over ranks of t``; every rank's ``y`` depends on every
    rank's ``t``, so the gradient of ``t`` is the sum over ranks of the
    gradients of ``y``."""

    @staticmethod
    def forward(ctx, t: Tensor) -> Tensor:
        return all_reduce(t.clone(memory_format=torch.contiguous_format),
                          'sum')

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return all_reduce(grad.clone(memory_format=torch.contiguous_format),
                          'sum')


def global_sum(t: Tensor) -> Tensor:
    """Differentiable sum of ``t`` over all ranks (a new tensor; ``t`` is
    left untouched).

    The backward pass all-reduces the incoming gradient, so it is a
    collective too: every rank must call :func:`global_sum` the same number
    of times, in the same order, and every rank's loss must depend on the
    result whenever one rank's does. Without a process group (or with one
    worker) it returns a copy of ``t``.
    """
    return _GlobalSum.apply(t)


def all_gather_object(obj) -> List:
    """Gathers one picklable object from every rank (small metadata only)."""
    if not _active():
        return [obj]
    _STATS['collectives'] += 1
    out: List = [None] * get_world_size()
    start = time.perf_counter()
    try:
        dist.all_gather_object(out, obj)
    except Exception as e:
        raise _peer_error('all_gather_object', None, e,
                          time.perf_counter() - start) from e
    return out


def all_to_all_v(tensors: Sequence[Tensor]) -> List[Tensor]:
    """Sends ``tensors[q]`` to rank ``q`` and returns what every rank sent here.

    Tensors may have different first dimensions per peer; trailing shape and
    dtype must agree across all ranks. Sizes are exchanged first, then the
    rows travel as point-to-point messages (empty ones are skipped).
    """
    world_size = get_world_size()
    if len(tensors) != world_size:
        raise ValueError(f"all_to_all_v needs one tensor per rank "
                         f"({world_size}), got {len(tensors)}")
    rank = get_rank()
    if not _active():
        return [tensors[0]]
    counts = torch.tensor([t.shape[0] for t in tensors], dtype=torch.long)
    recv_counts = _all_to_all_counts(counts)
    trailing = tuple(tensors[rank].shape[1:])
    dtype = tensors[rank].dtype
    sends = {q: [tensors[q]] for q in range(world_size) if q != rank}
    recv_shapes = {q: [((int(recv_counts[q]), *trailing), dtype)]
                   for q in range(world_size) if q != rank}
    pending = post_exchange(sends, recv_shapes, device=tensors[rank].device)
    received = pending.wait()
    return [tensors[q] if q == rank else received[q][0]
            for q in range(world_size)]


def _all_to_all_counts(counts: Tensor) -> Tensor:
    out = torch.empty_like(counts)
    send, recv = _comm_device(counts), _comm_device(out)
    _STATS['collectives'] += 1
    nbytes = counts.numel() * counts.element_size()
    _STATS['bytes_sent'] += nbytes
    _STATS['bytes_received'] += nbytes
    _wait(dist.all_to_all_single(recv, send, async_op=True), 'all_to_all')
    return recv.cpu() if recv is not out else out


# Point-to-point exchanges ####################################################

class PendingExchange:
    """Messages posted by :func:`post_exchange`; :meth:`wait` returns the
    received tensors, ``{peer: [tensor, ...]}``."""

    def __init__(self, works, received: Dict[int, List[Tensor]],
                 keep_alive: List[Tensor], device: torch.device) -> None:
        self._works = works
        self._received = received
        self._keep_alive = keep_alive
        self._device = device

    def wait(self) -> Dict[int, List[Tensor]]:
        for work, what, peer in self._works:
            _wait(work, what, peer)
        self._works = []
        self._keep_alive = []
        return {peer: [t.to(self._device) for t in tensors]
                for peer, tensors in self._received.items()}


def _split(flat: Tensor) -> List[Tensor]:
    """Cuts a flat tensor into messages of at most the configured size."""
    step = max(1, _CONFIG.max_bytes_per_message // max(flat.element_size(), 1))
    return list(flat.split(step)) if flat.numel() > step else [flat]


def _post(op, tensor: Tensor, peer: int, tag: int):
    """Posts one isend/irecv; a peer whose connection is gone already
    fails here rather than in the wait."""
    what = 'send' if op is dist.isend else 'receive'
    start = time.perf_counter()
    try:
        return op(tensor, peer, tag=tag)
    except Exception as e:
        raise _peer_error(what, peer, e, time.perf_counter() - start) from e


def post_exchange(
    sends: Dict[int, Sequence[Tensor]],
    recv_shapes: Dict[int, Sequence[Tuple[Tuple[int, ...], torch.dtype]]],
    device: Optional[torch.device] = None,
    tag: int = 0,
) -> PendingExchange:
    """Posts non-blocking sends and receives whose sizes both sides know.

    Args:
        sends: ``{peer: [tensor, ...]}`` to send to each peer.
        recv_shapes: ``{peer: [(shape, dtype), ...]}`` expected from each peer,
            in the order the peer sends them.
        device: Where received tensors are returned.
        tag: Channel of the messages; exchanges that may be in flight at the
            same time between the same two ranks use different tags.

    Both sides must post matching lists in the same order. Empty tensors are
    not sent (the receiver skips them too, since it knows their size), so a
    peer with nothing to exchange costs nothing. Receives are posted before
    sends to avoid transport-level stalls.
    """
    device = device or torch.device('cpu')
    works, keep_alive = [], []
    received: Dict[int, List[Tensor]] = {}
    exchange_ran = False
    for peer, specs in recv_shapes.items():
        out = []
        for shape, dtype in specs:
            buf = torch.empty(shape, dtype=dtype, device=device)
            if buf.numel() > 0:
                wire = _comm_device(buf)
                for piece in _split(wire.view(-1)):
                    works.append((_post(dist.irecv, piece, peer, tag),
                                  'receive', peer))
                    _STATS['messages_received'] += 1
                    exchange_ran = True
                _STATS['bytes_received'] += buf.numel() * buf.element_size()
                if wire is not buf:  # nccl: copy back after waiting
                    keep_alive.append(wire)
                    buf = wire
            out.append(buf)
        received[peer] = out
    for peer, tensors in sends.items():
        for tensor in tensors:
            if tensor.numel() == 0:
                continue
            wire = _comm_device(tensor.contiguous())
            keep_alive.append(wire)
            for piece in _split(wire.view(-1)):
                works.append((_post(dist.isend, piece, peer, tag), 'send',
                              peer))
                _STATS['messages_sent'] += 1
                exchange_ran = True
            _STATS['bytes_sent'] += tensor.numel() * tensor.element_size()
    if exchange_ran:
        _STATS['collectives'] += 1
    return PendingExchange(works, received, keep_alive, device)


# Model-level helpers #########################################################

def sync_params(model: torch.nn.Module, src: int = 0) -> None:
    """Broadcasts rank ``src``'s parameters and buffers to every rank, so all
    workers start from identical weights."""
    if not _active():
        return
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            broadcast_(tensor.data, src)


def all_reduce_grads(model: torch.nn.Module) -> None:
    """Sums parameter gradients over all ranks (in one flat message).

    Each worker's gradient is the partial sum over its own nodes, so write the
    loss as ``local_sum / global_count`` (see :func:`global_count`): the sum
    over ranks then equals the single-process mean-loss gradient exactly.
    Parameters without a gradient on some rank are treated as zero.
    """
    if not _active():
        return
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return
    flat = torch.cat([
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
        for p in params
    ])
    all_reduce(flat, 'sum')
    offset = 0
    for p in params:
        n = p.numel()
        chunk = flat[offset:offset + n].view_as(p)
        if p.grad is None:
            p.grad = chunk.clone()
        else:
            p.grad.copy_(chunk)
        offset += n


def ddp_sum_hook(state, bucket):
    """``DistributedDataParallel`` communication hook that *sums* gradients.

    DDP averages gradients over ranks; pyg_sar's loss convention
    (``local_sum / global_count``) needs the sum. Register it with
    ``ddp_model.register_comm_hook(None, pyg_sar.comm.ddp_sum_hook)`` and the
    DDP-trained model equals single-process training, like
    :func:`all_reduce_grads` does without DDP.
    """
    tensor = bucket.buffer()
    nbytes = tensor.numel() * tensor.element_size()
    _STATS['collectives'] += 1
    _STATS['bytes_sent'] += nbytes
    _STATS['bytes_received'] += nbytes
    future = dist.all_reduce(tensor, async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0])


def global_count(mask_or_count) -> int:
    """The number of ``True`` entries of a mask (or an integer count) summed
    over all ranks; the denominator of a distributed mean loss."""
    if isinstance(mask_or_count, Tensor):
        local = int(mask_or_count.sum()) if mask_or_count.dtype == torch.bool \
            else int(mask_or_count.numel())
    else:
        local = int(mask_or_count)
    total = torch.tensor([local], dtype=torch.long)
    return int(all_reduce(total, 'sum')[0])


# Checkpoint storage ##########################################################
# torch.distributed.checkpoint (DCP) for tensors that are the same on every
# rank (model and optimizer state of replicated modules): DCP's default save
# planner deduplicates equal keys across ranks, so each tensor is written
# once, by the least-loaded rank. Its coordination runs on the default
# process group, whose waits are bounded by init_distributed's timeout.

def _dcp_no_dist() -> bool:
    return not (dist.is_available() and dist.is_initialized())


def _dcp_error(what: str, path: str, e: BaseException) -> OSError:
    first = str(e).strip().splitlines()
    return OSError(f"rank {get_rank()}: {what} '{path}' failed: "
                   f"{type(e).__name__}: {first[0] if first else ''}")


def save_replicated(tensors: Dict[str, Tensor], path: str) -> None:
    """Writes ``{name: tensor}`` into the directory ``path`` (collective).

    Every rank passes the same names with equal tensors (replicas); each
    tensor is stored once across all ranks. Only tensors: DCP pickles other
    values and reads them back with ``weights_only=False``.
    """
    import warnings

    from torch.distributed import checkpoint as dcp
    bad = [k for k, v in tensors.items() if not isinstance(v, Tensor)]
    if bad:
        raise TypeError(f"save_replicated takes tensors only (got "
                        f"{type(tensors[bad[0]]).__name__} for {bad[0]!r})")
    _STATS['collectives'] += 1
    try:
        with warnings.catch_warnings():  # "assuming ... a single process"
            warnings.simplefilter('ignore', UserWarning)
            dcp.save(tensors, storage_writer=dcp.FileSystemWriter(
                path, sync_files=True), no_dist=_dcp_no_dist())
    except Exception as e:
        raise _dcp_error('writing checkpoint tensors to', path, e) from e


def replicated_specs(path: str) -> Dict[str, Tuple[torch.Size, torch.dtype]]:
    """Names, shapes and dtypes of the tensors :func:`save_replicated`
    wrote into ``path`` (local read of its metadata file)."""
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    try:
        metadata = dcp.FileSystemReader(path).read_metadata()
    except Exception as e:
        raise _dcp_error('reading checkpoint metadata of', path, e) from e
    return {name: (m.size, m.properties.dtype)
            for name, m in metadata.state_dict_metadata.items()
            if isinstance(m, TensorStorageMetadata)}


def load_replicated(tensors: Dict[str, Tensor], path: str) -> None:
    """Fills ``{name: tensor}`` in place from ``path`` (collective; every
    rank reads every tensor)."""
    import warnings

    from torch.distributed import checkpoint as dcp
    _STATS['collectives'] += 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', UserWarning)
            dcp.load(tensors, storage_reader=dcp.FileSystemReader(path),
                     no_dist=_dcp_no_dist())
    except Exception as e:
        raise _dcp_error('reading checkpoint tensors from', path, e) from e
