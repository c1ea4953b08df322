"""This worker's part of a dataset, partitioned once: the line that replaces
``data = dataset[0]`` in a PyG script launched with ``torchrun``.

:func:`distribute` joins the process group of the launch (when it has not
been joined yet), lets rank 0 partition the graph into one part per worker
the first time, and loads this worker's part on every rank. The partition
is kept under ``root`` in a folder named after the world size and a
SHA-256 digest of the graph's content and the partitioning options, so a
later run with the same graph reuses it (its files are checked against the
hashes the partitioner recorded, as :func:`~pyg_sar.load_partition` always
does), and a changed graph, another world size or other options get a new
folder: a partition is never silently reused for a different graph, nor
replaced.
"""
from __future__ import annotations

import hashlib
import os
import os.path as osp
import threading
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor

from torch_geometric.data import Data, Dataset, HeteroData

from pyg_sar import comm
from pyg_sar.comm.process_group import is_joined
from pyg_sar.partition import load_partition, partition_graph

#: Seconds between the waiting ranks' checks on rank 0 while it partitions:
#: each check is one small collective, well inside the package's timeout,
#: so a long partitioning run never looks like a dead peer, and a dead
#: rank 0 is noticed within the timeout.
HEARTBEAT_S = 5.0

Source = Union[Data, HeteroData, Dataset, Callable[[], Any]]


def distribute(dataset: Source, root: str, *, method: str = 'auto',
               seed: int = 0, balance_train: bool = True,
               progress: Optional[bool] = None):
    r"""Returns this worker's part of :obj:`dataset`, partitioning it once.

    .. code-block:: python

        dataset = Planetoid(path, 'Cora')
        data = pyg_sar.distribute(dataset, path)  # was: data = dataset[0]

    Only rank 0 reads the graph (``dataset[0]`` of a one-graph PyG
    dataset, a :class:`~torch_geometric.data.Data` or
    :class:`~torch_geometric.data.HeteroData`, or what a callable returns:
    pass ``lambda: Reddit(path)[0]`` and the other workers never load the
    whole graph). The first time, it writes the partition with
    :func:`~pyg_sar.partition_graph` into
    ``root/pyg_sar-<N>parts-<digest>``, where ``<digest>`` hashes the
    graph's tensors and the options below; the other ranks wait (with a
    small collective every few seconds, so a partitioning run of any length
    is not mistaken for a dead peer) and every rank then loads its own part
    with :func:`~pyg_sar.load_partition`. ``root`` must be a folder every
    worker can read (a shared file system across nodes).

    Args:
        dataset: The graph, as above.
        root (str): The folder that keeps the partitions (created if
            absent), e.g. the dataset's own root.
        method, seed, balance_train, progress: Passed to
            :func:`~pyg_sar.partition_graph`.

    Returns:
        The :class:`~pyg_sar.Partition` (or
        :class:`~pyg_sar.HeteroPartition`) of this worker.
    """
    if not is_joined():
        comm.init_distributed()
    rank, world_size = comm.get_rank(), comm.get_world_size()
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"distribute: root must be a folder path (got "
                        f"{type(root).__name__})")
    root = os.fspath(root)
    options = {'method': method, 'seed': seed,
               'balance_train': balance_train}
    if rank == 0:
        try:
            data = _graph_of(dataset)
            out_dir = osp.join(root, f'pyg_sar-{world_size}parts-'
                               f'{content_digest(data, options)[:16]}')
        except BaseException as e:
            _tell_peers(f'error: {_one_line(e)}')
            raise
        _partition_on_rank0(data, world_size, out_dir, options, progress)
    else:
        out_dir = _wait_for_rank0()
    return load_partition(out_dir, rank)


def content_digest(data: Union[Data, HeteroData], options: dict) -> str:
    r"""SHA-256 of every tensor of :obj:`data` (name, dtype, shape and
    bytes, in a fixed order), its other attributes' :func:`repr` and the
    partitioning :obj:`options`."""
    digest = hashlib.sha256(repr(sorted(options.items())).encode())
    digest.update(type(data).__name__.encode())
    stores = sorted(((repr(getattr(s, '_key', None)), s)
                     for s in data.stores), key=lambda item: item[0])
    for key, store in stores:
        digest.update(b'\0store\0' + key.encode())
        for name in sorted(store.keys()):
            value = store[name]
            digest.update(b'\0' + name.encode() + b'\0')
            if isinstance(value, Tensor):
                value = value.detach().cpu().contiguous()
                digest.update(f'{value.dtype}{tuple(value.shape)}'.encode())
                digest.update(value.view(-1).view(torch.uint8).numpy()
                              .data if value.numel() else b'')
            else:
                digest.update(repr(value).encode())
    return digest.hexdigest()


def _graph_of(dataset: Source) -> Union[Data, HeteroData]:
    if isinstance(dataset, Dataset):
        if len(dataset) != 1:
            raise ValueError(f"distribute: expected a dataset of one graph "
                             f"(got {type(dataset).__name__} with "
                             f"{len(dataset)} graphs)")
        dataset = dataset[0]
    elif callable(dataset) and not isinstance(dataset, (Data, HeteroData)):
        dataset = dataset()
    if not isinstance(dataset, (Data, HeteroData)):
        raise TypeError(f"distribute: expected a Data, a HeteroData, a "
                        f"one-graph PyG dataset or a callable returning one "
                        f"(got {type(dataset).__name__})")
    return dataset


def _partition_on_rank0(data, world_size: int, out_dir: str,
                        options: dict, progress) -> None:
    """Partitions (when ``out_dir`` holds no partition yet) in a thread
    while telling the other ranks every :data:`HEARTBEAT_S` seconds that
    rank 0 is still working; then tells them the folder or the error."""
    if osp.exists(osp.join(out_dir, 'META.json')):
        _tell_peers(f'done: {out_dir}')
        return
    failure = []

    def work():
        try:
            os.makedirs(osp.dirname(out_dir) or '.', exist_ok=True)
            partition_graph(data, world_size, out_dir, progress=progress,
                            **options)
        except BaseException as e:  # re-raised on rank 0 below
            failure.append(e)

    thread = threading.Thread(target=work, name='pyg_sar-distribute',
                              daemon=True)
    thread.start()
    while True:
        thread.join(HEARTBEAT_S)
        if thread.is_alive():
            _tell_peers('working')
            continue
        if failure:
            _tell_peers(f'error: {_one_line(failure[0])}')
            raise failure[0]
        _tell_peers(f'done: {out_dir}')
        return


def _tell_peers(status: str) -> None:
    comm.all_gather_object(status)


def _wait_for_rank0() -> str:
    while True:
        status = comm.all_gather_object(None)[0]
        if not isinstance(status, str):
            raise RuntimeError(f"distribute: rank 0 sent {status!r}; "
                               f"expected a status line")
        if status == 'working':
            continue
        if status.startswith('done: '):
            return status[len('done: '):]
        raise RuntimeError(f"distribute: rank 0 could not partition the "
                           f"dataset ({status[len('error: '):]})")


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f'{type(error).__name__}: {text[0] if text else ""}'


__all__ = ['distribute', 'content_digest']
