"""K parallel shard writers: :func:`partition_graph_parallel` runs the
homogeneous partitioner (:func:`pyg_sar.partition.homogeneous.write_homogeneous`)
on every rank of the process group, with :class:`ProcessGroupExchange` as its
exchange.

Rank 0 checks the input, computes the assignment (or takes a given one) and
broadcasts the relabelling; rank :obj:`r` then reads the :obj:`r`-th slice of
the edge list and of the node rows (memory-mapped from a graph directory,
:mod:`pyg_sar.partition.ondisk`), sends every edge and node row to the writer
of its part with :func:`~pyg_sar.comm.all_to_all_v`, and writes parts
:obj:`r, r + K, ...`; rank 0 writes the maps, hashes every file and writes
the manifest once all parts are done, then renames the folder into place.
The files are byte for byte those of one writer.

The output folder must be one shared path for all ranks (one host, or a
shared file system across hosts). Every wait is bounded by the timeout of
:func:`~pyg_sar.comm.init_distributed` (rank 0's assignment included, so
give a large graph a generous one).
"""
import math
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import Tensor

from pyg_sar.comm.collectives import (all_gather_object, all_reduce,
                                      all_to_all_v, broadcast_)
from pyg_sar.comm.process_group import get_rank, get_world_size
from pyg_sar.partition.api import auto_method
from pyg_sar.partition.homogeneous import write_homogeneous
from pyg_sar.partition.ondisk import GraphOnDisk
from pyg_sar.partition.shards import MAX_UNIT_EDGES


class ProcessGroupExchange:
    r"""The collectives of :func:`~pyg_sar.partition.shards.write_shards`
    over the process group. Rows travel as raw bytes, so every dtype (bool,
    half, complex) crosses any backend."""

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


def partition_graph_parallel(
    data: Any,
    num_parts: int,
    out_dir: str,
    method: str = 'auto',
    balance_train: bool = True,
    seed: int = 0,
    overwrite: bool = False,
    progress: Optional[bool] = None,
    allow_non_finite: bool = False,
    assignment: Optional[Tensor] = None,
    chunk_edges: Optional[int] = None,
    max_unit_edges: int = MAX_UNIT_EDGES,
    threads: Optional[int] = None,
) -> Optional[Dict[str, Any]]:
    r""":func:`~pyg_sar.partition.partition_graph` written by every rank of
    the process group (launch with ``torchrun --nproc-per-node K``, call
    :func:`~pyg_sar.comm.init_distributed` first; without a process group
    it is one writer). Every rank calls it with the same arguments.

    Args:
        data: A graph directory (:class:`str`, :class:`os.PathLike` or
            :class:`~pyg_sar.partition.ondisk.GraphOnDisk`), or a
            homogeneous :class:`~torch_geometric.data.Data` that every rank
            holds.
        assignment (torch.Tensor, optional): One part id per node, used
            instead of computing one (read on rank 0 only).
        chunk_edges (int, optional): Edges read per chunk. (default: 1/16
            of the edges, between 1M and 16M)
        max_unit_edges (int, optional): In-edges of a part written per pass
            (a larger part takes several passes over the edges).

    The other arguments are :func:`~pyg_sar.partition.partition_graph`'s.

    Returns:
        The manifest on rank 0, :obj:`None` on the other ranks.
    """
    from torch_geometric.data import Data, HeteroData
    if isinstance(data, HeteroData):
        raise ValueError("partition_graph_parallel takes a homogeneous graph "
                         "(Data or a graph directory); partition a "
                         "HeteroData with partition_graph")
    if method == 'auto':
        if not isinstance(data, (Data, GraphOnDisk)):
            data = GraphOnDisk(data)
        method = auto_method(int(data.num_edges))
    return write_homogeneous(
        data, num_parts, out_dir, method=method, balance_train=balance_train,
        seed=seed, overwrite=overwrite, progress=progress,
        allow_non_finite=allow_non_finite, exchange=ProcessGroupExchange(),
        assignment=assignment, chunk_edges=chunk_edges,
        max_unit_edges=max_unit_edges, threads=threads)


__all__ = ['partition_graph_parallel', 'ProcessGroupExchange']
