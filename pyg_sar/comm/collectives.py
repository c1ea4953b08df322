"""Collectives: barrier, reductions, broadcast, gathers (:func:`all_gather_by_id`:
every rank's rows in the order of their ids) and the variable-size
all-to-all, plus the differentiable :func:`global_sum`, :func:`global_mean` (a loss
over the global batch), :func:`global_count` and :func:`global_totals`.

Each one first keeps the ranks' operations paired
(:func:`~pyg_sar.comm.sequence.before_operation`: free unless this rank left
collective work unfinished or changed a shared setting) and runs on the
channel of the enclosing :func:`~pyg_sar.comm.on_channel` (the world group
outside one)."""
from __future__ import annotations

import math
from typing import Callable, List, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_sar.comm.agreement import agree, gather_objects
from pyg_sar.comm.channels import channel_group
from pyg_sar.comm.errors import timed_wait
from pyg_sar.comm.process_group import (comm_device, destroy_groups,
                                        get_rank, get_world_size, is_active)
from pyg_sar.comm.sequence import before_operation
from pyg_sar.comm.state import STATS


def barrier() -> None:
    """Waits for every rank, with the configured timeout."""
    if not is_active():
        return
    before_operation()
    _barrier()


def _barrier() -> None:
    STATS['collectives'] += 1
    timed_wait(dist.barrier(group=channel_group(), async_op=True), 'barrier')


def shutdown() -> None:
    """Leaves the process group cleanly at the end of a run: a barrier (no
    rank tears its connections down while a peer still uses them), then
    the package's groups and the default group are destroyed (no transport
    thread is left running at interpreter exit, which can abort the
    process). A run that never calls it is torn down at interpreter exit
    (:func:`~pyg_sar.comm.process_group.destroy_groups`, without the
    barrier)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if is_active():
            _barrier()  # the end: nothing left to pair or to shape
    finally:
        destroy_groups()


def all_reduce(tensor: Tensor, op: str = 'sum') -> Tensor:
    """In-place all-reduce of ``tensor`` (``'sum'``, ``'max'`` or ``'min'``)."""
    if not is_active():
        return tensor
    reduce_op = {'sum': dist.ReduceOp.SUM, 'max': dist.ReduceOp.MAX,
                 'min': dist.ReduceOp.MIN}[op]
    before_operation()
    buf = comm_device(tensor)
    STATS['collectives'] += 1
    nbytes = buf.numel() * buf.element_size()
    STATS['bytes_sent'] += nbytes
    STATS['bytes_received'] += nbytes
    timed_wait(dist.all_reduce(buf, op=reduce_op, group=channel_group(),
                               async_op=True), f'all_reduce({op})')
    if buf is not tensor:
        tensor.copy_(buf)
    return tensor


def broadcast_(tensor: Tensor, src: int = 0) -> Tensor:
    """In-place broadcast of ``tensor`` from rank ``src``."""
    if not is_active():
        return tensor
    before_operation()
    buf = comm_device(tensor)
    STATS['collectives'] += 1
    nbytes = buf.numel() * buf.element_size()
    if get_rank() == src:
        STATS['bytes_sent'] += nbytes
    else:
        STATS['bytes_received'] += nbytes
    timed_wait(dist.broadcast(buf, src=src, group=channel_group(),
                              async_op=True), f'broadcast(from rank {src})')
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


def global_mean(local_mean: Tensor, count) -> Tensor:
    """The mean over the global batch, from this rank's mean over its
    ``count`` items (e.g. ``F.cross_entropy(out, y)`` over
    ``batch.batch_size`` seeds).

    The value is the global mean, the same on every rank (what one process
    prints for the whole batch); its gradient is this rank's share,
    ``count / global count`` times that of ``local_mean``, so that after
    :func:`~pyg_sar.all_reduce_grads` every parameter holds the gradient
    of the global mean, as one process computes it. A rank with
    ``count == 0`` (whose mean is NaN) contributes nothing. A collective:
    every rank calls it, in the same order.
    """
    count = int(count)
    if count < 0:
        raise ValueError(f"global_mean: count must be >= 0 (got {count})")
    if not isinstance(local_mean, Tensor) or local_mean.numel() != 1:
        raise ValueError(f"global_mean: expected a one-element loss tensor "
                         f"(got {type(local_mean).__name__} of shape "
                         f"{tuple(getattr(local_mean, 'shape', ()))})")
    if count == 0:  # no items here: no value, no gradient
        local_mean = torch.where(torch.isnan(local_mean),
                                 torch.zeros_like(local_mean), local_mean)
    totals = torch.tensor([float(local_mean.detach()) * count, count],
                          dtype=torch.float64)
    total, n = all_reduce(totals, 'sum').tolist()
    if n == 0:
        return local_mean * 0.0
    share = local_mean * (count / n)
    return share + (total / n - share.detach()).to(share.dtype)


def global_totals(*values):
    """``values`` (Python numbers) each summed over all ranks, in one
    collective; integers stay integers. ``a, b = global_totals(a, b)``
    turns per-rank running sums (loss, correct, examples) into the global
    ones every rank then prints."""
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"global_totals: expected Python ints or floats "
                            f"(got {type(v).__name__})")
    out = all_reduce(torch.tensor([float(v) for v in values],
                                  dtype=torch.float64), 'sum').tolist()
    result = tuple(int(round(t)) if isinstance(v, int) else t
                   for v, t in zip(values, out))
    return result[0] if len(result) == 1 else result


def all_gather_object(obj) -> List:
    """Gathers one picklable object from every rank (small metadata only)."""
    if not is_active():
        return [obj]
    before_operation()
    return gather_objects(obj, channel_group())


def all_gather_by_id(rows: Tensor, ids: Tensor) -> Tensor:
    """Every rank's ``rows``, ordered by their ``ids``, on every rank: the
    tensor one process holds. With ``ids = part.orig_ids`` (the dataset ids
    of this rank's nodes) and one row per local node, row ``i`` of the
    result is dataset node ``i``'s, e.g. the whole graph's embeddings from
    the rows :func:`pyg_sar.train.inference` returns; with the ids of some
    rows (``part.orig_ids[mask]``), those rows in dataset-id order.

    ``ids`` holds one integer per row of ``rows``, distinct over all ranks
    (refused otherwise). A collective: every rank calls it, with any
    number of rows, the same dtype and the same row shape (agreed first,
    refused otherwise). Without a process group it sorts this rank's rows.
    """
    if not isinstance(rows, Tensor) or not isinstance(ids, Tensor) or \
            rows.dim() == 0 or ids.dim() != 1 or \
            ids.numel() != rows.size(0) or ids.is_floating_point() or \
            ids.dtype == torch.bool:
        raise ValueError(
            f"all_gather_by_id: expected rows [n, ...] and n integer ids "
            f"(got rows of shape {tuple(getattr(rows, 'shape', ()))} and ids "
            f"of shape {tuple(getattr(ids, 'shape', ()))}, dtype "
            f"{getattr(ids, 'dtype', type(ids).__name__)})")
    ids = ids.long()
    if is_active():
        before_operation()
        agree('gathering rows by id', {'dtype': str(rows.dtype),
                                       'row shape': tuple(rows.shape[1:])})
        world_size = get_world_size()
        wire = rows.to(torch.uint8) if rows.dtype == torch.bool else rows
        rows = torch.cat(all_to_all_v([wire.contiguous()] * world_size)
                         ).to(rows.dtype)
        ids = torch.cat(all_to_all_v([ids.contiguous()] * world_size))
    ids, order = torch.sort(ids.to(rows.device), stable=True)
    repeated = (ids[1:] == ids[:-1]).nonzero()
    if repeated.numel():
        raise ValueError(f"all_gather_by_id: id {int(ids[repeated[0, 0]])} "
                         f"is held by more than one row (expected distinct "
                         f"ids over all ranks)")
    return rows[order]


def all_to_all_v(tensors: Sequence[Tensor]) -> List[Tensor]:
    """Sends ``tensors[q]`` to rank ``q`` and returns what every rank sent here.

    Tensors may have different first dimensions per peer; trailing shape and
    dtype must agree across all ranks. Sizes are exchanged first, then the
    rows travel in one ``all_to_all_single`` with split sizes (a rank's own
    tensor stays where it is).
    """
    world_size = get_world_size()
    if len(tensors) != world_size:
        raise ValueError(f"all_to_all_v needs one tensor per rank "
                         f"({world_size}), got {len(tensors)}")
    rank = get_rank()
    if not is_active():
        return [tensors[0]]
    before_operation()
    mine = tensors[rank]
    trailing, device = tuple(mine.shape[1:]), mine.device
    send_counts = [0 if q == rank else int(t.shape[0])
                   for q, t in enumerate(tensors)]
    recv_counts = _all_to_all_counts(
        torch.tensor(send_counts, dtype=torch.long)).tolist()
    send = comm_device(torch.cat(
        [t.reshape(-1, *trailing) for q, t in enumerate(tensors) if q != rank]
        or [mine.new_empty((0, *trailing))]).contiguous())
    recv = send.new_empty((sum(recv_counts), *trailing))
    row_bytes = send.element_size() * math.prod(trailing)
    STATS['collectives'] += 1
    STATS['bytes_sent'] += sum(send_counts) * row_bytes
    STATS['bytes_received'] += sum(recv_counts) * row_bytes
    STATS['messages_sent'] += sum(1 for n in send_counts if n)
    STATS['messages_received'] += sum(1 for n in recv_counts if n)
    timed_wait(dist.all_to_all_single(recv, send, recv_counts, send_counts,
                                      group=channel_group(), async_op=True),
               'all_to_all')
    received = list(recv.to(device).split(recv_counts))
    received[rank] = mine
    return received


def ask_owners(keys: Tensor, owner: Tensor,
               answer: Callable[[Tensor], Tensor]) -> Tensor:
    """Sends every key to the rank ``owner`` names; that rank answers the
    keys each rank sent it with ``answer(keys)`` (one row per key, the same
    trailing shape and dtype on every rank, also for no keys). Returns the
    answers in the order of ``keys``. Collective: every rank calls it, with
    any number of keys (two :func:`all_to_all_v`)."""
    order = torch.argsort(owner, stable=True)
    counts = torch.bincount(owner, minlength=get_world_size()).tolist()
    asked = all_to_all_v(list(keys[order].split(counts)))
    answers = torch.cat(all_to_all_v([answer(q) for q in asked]))
    out = torch.empty_like(answers)
    out[order] = answers
    return out


def _all_to_all_counts(counts: Tensor) -> Tensor:
    out = torch.empty_like(counts)
    send, recv = comm_device(counts), comm_device(out)
    STATS['collectives'] += 1
    nbytes = counts.numel() * counts.element_size()
    STATS['bytes_sent'] += nbytes
    STATS['bytes_received'] += nbytes
    timed_wait(dist.all_to_all_single(recv, send, group=channel_group(),
                                      async_op=True), 'all_to_all')
    return recv.cpu() if recv is not out else out


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
