"""The collectives of K cooperating partition writers over the process
group: :class:`ProcessGroupExchange` is the :obj:`exchange` that
:func:`pyg_sar.partition.partition_graph_parallel` runs its K writers with
under ``torchrun``, built on this stage's timed collectives
(:func:`~pyg_sar.comm.all_to_all_v`, :func:`~pyg_sar.comm.all_reduce`,
:func:`~pyg_sar.comm.all_gather_object`, :func:`~pyg_sar.comm.broadcast_`).
The partitioner is an earlier stage and never imports this one: the caller
hands the exchange in.
"""
import math
from typing import Any, List, Sequence

import torch
from torch import Tensor

from pyg_sar.comm.collectives import (all_gather_object, all_reduce,
                                      all_to_all_v, broadcast_)
from pyg_sar.comm.process_group import get_rank, get_world_size


class ProcessGroupExchange:
    r"""The collectives of
    :func:`~pyg_sar.partition.write.shards.write_shards` over the process
    group, for the K writers of
    :func:`~pyg_sar.partition.partition_graph_parallel`. Rows travel as
    raw bytes, so every dtype (bool, half, complex) crosses any backend."""

    def __init__(self):
        self.rank = get_rank()
        self.world_size = get_world_size()

    def all_to_all(self, tensors: Sequence[Tensor]) -> List[Tensor]:
        first = tensors[0]
        dtype, trailing = first.dtype, tuple(first.shape[1:])
        row_bytes = math.prod(trailing) * first.element_size()
        if row_bytes == 0:
            return [t.clone() for t in all_to_all_v(list(tensors))]
        raw = [t.contiguous().view(-1).view(torch.uint8)
               .reshape(t.shape[0], row_bytes) if t.numel() else
               torch.empty((0, row_bytes), dtype=torch.uint8)
               for t in tensors]
        return [r.contiguous().view(-1).view(dtype).reshape(-1, *trailing)
                if r.numel() else torch.empty((0, ) + trailing, dtype=dtype)
                for r in all_to_all_v(raw)]

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        return all_reduce(tensor, 'sum')

    def gather_objects(self, obj: Any) -> List[Any]:
        return all_gather_object(obj)

    def broadcast(self, tensor: Tensor) -> Tensor:
        return broadcast_(tensor, 0)


__all__ = ['ProcessGroupExchange']
