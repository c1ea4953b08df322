"""The partitioner's entry points: :func:`partition_graph` hands a
homogeneous :class:`~torch_geometric.data.Data` or a graph on disk
(:mod:`~pyg_sar.partition.input.ondisk`) to
:mod:`~pyg_sar.partition.write.homogeneous` and a
:class:`~torch_geometric.data.HeteroData` to
:mod:`~pyg_sar.partition.write.heterogeneous`;
:func:`partition_graph_parallel` runs the homogeneous writer as one of K
processes."""
import importlib.util
import os
from typing import Any, Dict, Optional, Union

from torch import Tensor

from torch_geometric.data import Data, HeteroData

from pyg_sar.partition.input.ondisk import GraphOnDisk
from pyg_sar.partition.input.pyg_inputs import normalize_pyg_inputs
from pyg_sar.partition.write.heterogeneous import partition_hetero_graph
from pyg_sar.partition.write.homogeneous import write_homogeneous
from pyg_sar.partition.write.shards import MAX_UNIT_EDGES


# Edges from which method='auto' picks KaMinPar: METIS holds ~117 bytes per
# input edge (1.1 GiB here), KaMinPar's memory-efficient run ~9-20.
AUTO_KAMINPAR_EDGES = 10_000_000


def auto_method(num_edges: int) -> str:
    r"""The method :obj:`method='auto'` runs for a graph of
    :obj:`num_edges` edges: :obj:`'kaminpar'` from
    :obj:`AUTO_KAMINPAR_EDGES` edges on when KaMinPar is installed, else
    :obj:`'metis'`."""
    if num_edges >= AUTO_KAMINPAR_EDGES and \
            importlib.util.find_spec('kaminpar') is not None:
        return 'kaminpar'
    return 'metis'


def partition_graph(
    data: Union[Data, HeteroData, str, os.PathLike, GraphOnDisk],
    num_parts: int,
    out_dir: str,
    method: str = 'auto',
    balance_train: bool = True,
    seed: int = 0,
    overwrite: bool = False,
    progress: Optional[bool] = None,
    allow_non_finite: bool = False,
    threads: Optional[int] = None,
    resume: bool = True,
) -> Dict[str, Any]:
    r"""Partitions :obj:`data` into :obj:`num_parts` parts and writes them to
    :obj:`out_dir` in PyG's distributed on-disk format.

    A :class:`~torch_geometric.data.HeteroData` is partitioned by
    :func:`pyg_sar.partition.write.heterogeneous.partition_hetero_graph` (every
    node type balanced, per-type ids, PyG's heterogeneous layout); the rest
    of this description is about a homogeneous :class:`Data`.

    A graph on disk (a directory written by
    :func:`~pyg_sar.partition.input.ondisk.save_graph` or laid out as
    :mod:`~pyg_sar.partition.input.ondisk` describes, or a
    :class:`~pyg_sar.partition.input.ondisk.GraphOnDisk`) is read
    memory-mapped: its files are checked (size against header, dtype, shape) and its data
    streamed (ids in range, no NaN or inf, labels) before any shard is
    written, then edges and rows are read a chunk at a time, so that
    neither :obj:`edge_index` nor :obj:`x` is ever whole in memory beyond
    what the assignment needs. Given the same assignment the files are
    byte for byte those of the in-memory path. K processes can write the
    shards in parallel (``torchrun ... -m pyg_sar.cli partition --input``):
    :func:`partition_graph_parallel`.

    Nodes are relabeled so that part :obj:`i` owns the contiguous new ids
    :obj:`node_ptr[i]` to :obj:`node_ptr[i + 1] - 1` (stable in the input
    order), and edges so that every part's incoming edges get contiguous new
    ids, sorted by :obj:`(dst, src)`. :obj:`perm.pt` maps new node ids to
    input ids. Every node attribute (first dimension :obj:`num_nodes`) and
    edge attribute (first dimension :obj:`num_edges`) is kept.

    Refused with a one-line error naming the attribute: a tensor with one
    row per edge named like a node attribute (:obj:`x`, :obj:`y`,
    :obj:`pos`, :obj:`*_mask`), negative integer labels :obj:`y` on a node
    of a mask (:obj:`train_mask`, :obj:`val_mask`, ...), NaN or inf (see
    :obj:`allow_non_finite`). A graph without :obj:`x` is partitioned
    (structure-only partitions are fine).

    The output is written to a temporary folder next to :obj:`out_dir` and
    renamed when complete, so a failed run leaves nothing behind. A graph
    directory is partitioned resumably: its phases (input check,
    symmetrized graph, KaMinPar's parts, final assignment) are recorded
    with the size and SHA-256 of their files in a work directory
    ``.<out_dir name>.work`` next to :obj:`out_dir`, removed once the
    partition is in place; a run that died (out of memory, killed, disk
    full) and is started again with the same arguments on the same input
    files skips every phase whose files still verify (see
    :obj:`resume`). Before the long phases, the free space of
    :obj:`out_dir`'s file system is checked against the bytes they will
    write: too little is a one-line :class:`OSError` naming the path, the
    bytes needed and the bytes free. The
    manifest records the size and SHA-256 of every file written
    (:obj:`files`; about 0.3 s per GB on two cores), which
    :func:`load_partition` checks for every file it reads. Of two runs into
    the same :obj:`out_dir` without :obj:`overwrite`, the second to finish
    fails instead of replacing the first's output.

    Args:
        data (torch_geometric.data.Data or HeteroData or str or GraphOnDisk):
            The graph, in memory or a graph directory.
        num_parts (int): Number of parts, between 1 and the number of nodes.
        out_dir (str): Output directory. Must be empty or absent unless
            :obj:`overwrite` is set.
        method (str, optional): :obj:`"metis"` (k-way METIS on the
            symmetrized graph, pymetis, single-threaded),
            :obj:`"kaminpar"` (KaMinPar, ``pip install kaminpar``: a cut
            like METIS's in a fraction of its memory; run on a temporary
            ParHIP file in a child process, so a crash is a one-line
            error; node balance capped at 1.01) or :obj:`"random"`
            (balanced random assignment). See
            :func:`pyg_sar.partition.assign.parts.assign_parts`. :obj:`"auto"`
            picks KaMinPar for graphs of :obj:`AUTO_KAMINPAR_EDGES` (10M)
            edges or more, where METIS's ~117 bytes per edge start to
            matter, and METIS below; the manifest records the method that
            ran. (default: :obj:`"auto"`)
        resume (bool, optional): For a graph directory: continue a run into
            the same :obj:`out_dir` with the same arguments that died,
            from its last completed phase (every reused file is hashed
            again first; a mismatch redoes the phase). :obj:`False` discards
            such a run's work directory. (default: :obj:`True`)
        threads (int, optional): KaMinPar's threads. The seed reproduces
            KaMinPar's assignment with one thread only; more threads are
            faster but differ from run to run. Ignored by the other
            methods. (default: :obj:`1`)
        balance_train (bool, optional): If set and :obj:`data.train_mask`
            exists, also balance the number of training nodes per part.
            (default: :obj:`True`)
        seed (int, optional): Seed of METIS and of the random assignment.
            (default: :obj:`0`)
        overwrite (bool, optional): Replace an existing partition in
            :obj:`out_dir`. The old one is removed only after the new one is
            complete. (default: :obj:`False`)
        progress (bool, optional): Show a progress bar. (default: when
            standard error is a terminal)
        allow_non_finite (bool, optional): Partition floating node and edge
            attributes that hold NaN or inf. By default they raise a
            :class:`ValueError` naming the attribute, the number of affected
            rows and the first one. The check sums each floating attribute
            once (about 2 ms for a 200k x 128 float32 :obj:`x`).
            (default: :obj:`False`)

    Returns:
        The manifest written to :obj:`out_dir/pyg_sar.json`.
    """
    data = normalize_pyg_inputs(data)  # adj_t, RandomLinkSplit attributes
    if method == 'auto':
        if not isinstance(data, (Data, HeteroData, GraphOnDisk)):
            data = GraphOnDisk(data)  # opened once: headers only
        method = auto_method(int(data.num_edges))
    if isinstance(data, HeteroData):
        return partition_hetero_graph(
            data, num_parts, out_dir, method=method,
            balance_train=balance_train, seed=seed, overwrite=overwrite,
            progress=progress, allow_non_finite=allow_non_finite)
    # threads is passed only when set, so that writers without it still run.
    extra = {} if threads is None else {'threads': threads}
    if not resume:
        extra['resume'] = False
    return write_homogeneous(
        data, num_parts, out_dir, method=method, balance_train=balance_train,
        seed=seed, overwrite=overwrite, progress=progress,
        allow_non_finite=allow_non_finite, **extra)


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
    resume: bool = True,
    *,
    exchange: Any,
) -> Optional[Dict[str, Any]]:
    r""":func:`partition_graph` written by K processes that cooperate
    through :obj:`exchange`, the collectives of the K writers: under
    ``torchrun --nproc-per-node K``, after
    :func:`~pyg_sar.comm.init_distributed`, pass
    :class:`pyg_sar.comm.ProcessGroupExchange` (without a process group it
    is one writer). Every rank calls it with the same arguments.

    Rank 0 checks the input, computes the assignment (or takes a given one)
    and broadcasts the relabelling; rank :obj:`r` then reads the
    :obj:`r`-th slice of the edge list and of the node rows (memory-mapped
    from a graph directory, :mod:`pyg_sar.partition.input.ondisk`), sends
    every edge and node row to the writer of its part with
    :obj:`exchange.all_to_all`, and writes parts :obj:`r, r + K, ...`;
    rank 0 writes the maps, hashes every file and writes the manifest once
    all parts are done, then renames the folder into place. The files are
    byte for byte those of one writer.

    The output folder must be one shared path for all ranks (one host, or a
    shared file system across hosts). Every wait is bounded by the timeout
    of :func:`~pyg_sar.comm.init_distributed` (rank 0's assignment
    included, so give a large graph a generous one).

    Args:
        data: A graph directory (:class:`str`, :class:`os.PathLike` or
            :class:`~pyg_sar.partition.input.ondisk.GraphOnDisk`), or a
            homogeneous :class:`~torch_geometric.data.Data` that every rank
            holds.
        assignment (torch.Tensor, optional): One part id per node, used
            instead of computing one (read on rank 0 only).
        chunk_edges (int, optional): Edges read per chunk. (default: 1/16
            of the edges, between 1M and 16M)
        max_unit_edges (int, optional): In-edges of a part written per pass
            (a larger part takes several passes over the edges).
        exchange: The writers' collectives: :obj:`rank`,
            :obj:`world_size`, :meth:`all_to_all`, :meth:`all_reduce_sum`,
            :meth:`gather_objects` and :meth:`broadcast`, as
            :class:`~pyg_sar.partition.write.shards.LocalExchange` (one
            writer) and :class:`pyg_sar.comm.ProcessGroupExchange` (the
            process group) offer them.

    The other arguments are :func:`partition_graph`'s.

    Returns:
        The manifest on rank 0, :obj:`None` on the other ranks.
    """
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
        allow_non_finite=allow_non_finite, exchange=exchange,
        assignment=assignment, chunk_edges=chunk_edges,
        max_unit_edges=max_unit_edges, threads=threads, resume=resume)
