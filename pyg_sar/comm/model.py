"""Model-level helpers: identical initial weights on every rank, and gradients
summed over ranks (directly or as a ``DistributedDataParallel`` hook)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from pyg_sar.comm.collectives import all_reduce, broadcast_
from pyg_sar.comm.process_group import is_active
from pyg_sar.comm.state import STATS
from pyg_sar.utils.layer_guard import guard_layers


def sync_params(model: torch.nn.Module, src: int = 0) -> torch.nn.Module:
    """Broadcasts rank ``src``'s parameters and buffers to every rank, so all
    workers start from identical weights (a table sharded by the
    partition, flagged ``sar_sharded``, keeps each rank's own rows). Stock
    PyG layers left in the model refuse a :class:`~pyg_sar.DistGraph` with
    an error that names :func:`~pyg_sar.nn.to_distributed`
    (:mod:`pyg_sar.utils.layer_guard`). Returns ``model``, so that
    ``model = pyg_sar.sync_params(pyg_sar.nn.to_distributed(model))``
    converts and synchronizes in one line."""
    guard_layers(model)
    if not is_active():
        return model
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            if getattr(tensor, 'sar_sharded', False):
                continue
            broadcast_(tensor.data, src)
    return model


def all_reduce_grads(model: torch.nn.Module) -> None:
    """Sums parameter gradients over all ranks (in one flat message).

    Each worker's gradient is the partial sum over its own nodes, so write the
    loss as ``local_sum / global_count`` (see :func:`global_count`): the sum
    over ranks then equals the single-process mean-loss gradient exactly.
    Parameters without a gradient on some rank are treated as zero. A
    parameter sharded by the partition (``sar_sharded``, e.g.
    :class:`pyg_sar.nn.DistEmbedding`) is left alone: its rows are each
    rank's own and their gradients already summed at their owner.
    """
    if not is_active():
        return
    params = [p for p in model.parameters() if p.requires_grad and
              not getattr(p, 'sar_sharded', False)]
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
    :func:`all_reduce_grads` does without DDP. A parameter sharded by the
    partition (``sar_sharded``, e.g. :class:`pyg_sar.nn.DistEmbedding`) is
    refused: DDP would broadcast and sum it as a replica (train such a
    model with :func:`all_reduce_grads`, which keeps each rank's rows).
    """
    sharded = [p for p in bucket.parameters()
               if getattr(p, 'sar_sharded', False)]
    if sharded:
        raise ValueError(
            f"ddp_sum_hook: a parameter of shape {tuple(sharded[0].shape)} "
            f"is sharded by the partition (pyg_sar.nn.DistEmbedding); "
            f"DistributedDataParallel treats every parameter as a replica: "
            f"train this model without DDP, with pyg_sar.all_reduce_grads")
    tensor = bucket.buffer()
    nbytes = tensor.numel() * tensor.element_size()
    STATS['collectives'] += 1
    STATS['bytes_sent'] += nbytes
    STATS['bytes_received'] += nbytes
    future = dist.all_reduce(tensor, async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0])
