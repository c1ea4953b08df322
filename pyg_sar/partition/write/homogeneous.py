"""The homogeneous partitioner: :func:`write_homogeneous` checks a
:class:`~torch_geometric.data.Data` or a graph on disk
(:mod:`~pyg_sar.partition.input.ondisk`), assigns every node to a part,
relabels nodes so that every part owns one contiguous range of new ids (stable in
the input order) and edges so that every part's in-edges get contiguous new
ids sorted by :obj:`(dst, src)`, and writes the layout of
:class:`torch_geometric.distributed.Partitioner` (readable by
:class:`~torch_geometric.distributed.LocalGraphStore` and
:class:`~torch_geometric.distributed.LocalFeatureStore`) plus a
``pyg_sar.json`` manifest and the node permutation ``perm.pt``.

One writer for both inputs (:func:`write_shards`): the edge list is read in
chunks (:class:`~pyg_sar.partition.input.edge_source.EdgeSource`) and
attribute rows a block at a time, every file is streamed to disk
(:class:`~pyg_sar.partition.write.stream_save.StreamedSave`), so neither
:obj:`edge_index` nor :obj:`x` is ever whole in memory beyond what the
assignment needs. The same function runs as K parallel writers
(:func:`~pyg_sar.partition.partition_graph_parallel`): the files are byte
for byte the single writer's.
"""
import os
import os.path as osp
import time
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from torch_geometric.data import Data

from pyg_sar.partition.assign.parts import (KAMINPAR_FILE, PARHIP_FILE,
                                            assign_parts)
from pyg_sar.partition.input.checks import check_method, check_num_parts
from pyg_sar.partition.input.data_source import source_of_data
from pyg_sar.partition.input.edge_source import (DEFAULT_CHUNK_EDGES,
                                                 GraphSource, torch_dtype)
from pyg_sar.partition.input.ondisk import GraphOnDisk
from pyg_sar.partition.layout import META_FILE, PERM_FILE
from pyg_sar.partition.write.common import (class_count, count_per_part,
                                            manifest_header, max_over_mean,
                                            save_file)
from pyg_sar.partition.workdir import WorkDir
from pyg_sar.partition.write.out_dir import (check_out_dir, write_atomically,
                                             write_json)
from pyg_sar.partition.write.resume import (check_disk, disk_needed,
                                            open_work_dir)
from pyg_sar.partition.write.shards import (MAX_UNIT_EDGES, LocalExchange,
                                            write_shards)
from pyg_sar.utils.malloc import configure_allocator


def open_source(data: Any, allow_non_finite: bool = False
                ) -> Tuple[GraphSource, Optional[float]]:
    r"""The :class:`GraphSource` of a :class:`Data`, a
    :class:`~pyg_sar.partition.input.ondisk.GraphOnDisk` or a graph directory,
    checked (the directory's data streamed, before any shard is written)."""
    if isinstance(data, Data):
        return source_of_data(data, allow_non_finite)
    graph = _graph_on_disk(data)
    return graph.source(), _validate(graph, allow_non_finite, None)


def _graph_on_disk(data: Any) -> GraphOnDisk:
    if isinstance(data, (str, os.PathLike)):
        data = GraphOnDisk(data)
    if not isinstance(data, GraphOnDisk):
        raise TypeError(f"Expected a 'torch_geometric.data.Data', a "
                        f"'GraphOnDisk' or a graph directory (got "
                        f"'{type(data).__name__}')")
    return data


def _validate(graph: GraphOnDisk, allow_non_finite: bool,
              work: Optional[WorkDir]) -> float:
    r"""Streams over the input's data (skipped when the work directory
    records it as checked, for the same input files)."""
    check_start = time.perf_counter()
    if work is not None and work.verified('check') is not None:
        return 0.0
    graph.validate(allow_non_finite)
    if work is not None:
        work.record('check')
    return time.perf_counter() - check_start


def _train_mask(source: GraphSource) -> Optional[Tensor]:
    mask = source.node_attrs.get('train_mask')
    if mask is None or torch_dtype(mask) != torch.bool or mask.ndim != 1:
        return None  # not a usable mask: skip the train statistics
    return mask if isinstance(mask, Tensor) else torch.from_numpy(
        np.array(mask))


def write_homogeneous(
    data: Any,
    num_parts: int,
    out_dir: str,
    method: str = 'metis',
    balance_train: bool = True,
    seed: int = 0,
    overwrite: bool = False,
    progress: Optional[bool] = None,
    allow_non_finite: bool = False,
    exchange: Any = None,
    assignment: Optional[Tensor] = None,
    chunk_edges: Optional[int] = None,
    max_unit_edges: int = MAX_UNIT_EDGES,
    threads: Optional[int] = None,
    resume: bool = True,
) -> Optional[Dict[str, Any]]:
    r""":func:`pyg_sar.partition.partition_graph` for a homogeneous graph
    (a :class:`Data` or a graph on disk). With an :obj:`exchange` of K
    writers (:func:`~pyg_sar.partition.partition_graph_parallel`) every
    rank calls it:
    rank 0 checks the input, assigns the parts and writes the manifest,
    every rank writes its share of the shards; rank 0 returns the manifest,
    the others :obj:`None`. :obj:`assignment` (one part id per node) skips
    the partitioner. :obj:`chunk_edges` (edges read at a time) defaults to
    1/16 of the edges, between 1M and 16M. :obj:`threads`: KaMinPar's
    (see :func:`~pyg_sar.partition.assign.parts.assign_parts`).

    A graph directory whose assignment is computed here runs resumably:
    the input check, the ParHIP file, KaMinPar's parts and the final
    assignment are recorded in a work directory next to :obj:`out_dir`
    (:mod:`~pyg_sar.partition.workdir`), the output is built inside it, and
    it is removed once the partition is in place; with :obj:`resume` a
    matching one left by a run that died is picked up where it stopped.
    Before the long phases the free disk space is checked against their
    estimated needs (:mod:`~pyg_sar.partition.write.resume`)."""
    start_time = time.perf_counter()
    configure_allocator()  # freed chunk-sized blocks go back to the OS
    exchange = exchange or LocalExchange()
    out_dir = osp.abspath(os.fspath(out_dir))
    if exchange.rank != 0:
        return _follow(data, num_parts, exchange, chunk_edges,
                       max_unit_edges)
    work: Optional[WorkDir] = None
    try:
        check_method(method)
        if isinstance(data, Data):
            source, check_time = source_of_data(data, allow_non_finite)
        else:
            data = _graph_on_disk(data)
            source = data.source()  # headers only: checked below
        check_num_parts(num_parts, source.num_nodes)
        if assignment is not None:
            assignment = _check_assignment(assignment, source.num_nodes,
                                           num_parts)
        check_out_dir(out_dir, overwrite)
        if isinstance(data, GraphOnDisk) and assignment is None:
            work = open_work_dir(data, out_dir, num_parts, method, seed,
                                 balance_train, allow_non_finite, threads,
                                 resume).__enter__()
        disk = disk_needed(source, num_parts, 'given' if assignment is not
                           None else method,
                           set(work.phases) if work is not None else None)
        check_disk(osp.dirname(out_dir), disk['peak'])
        if isinstance(data, GraphOnDisk):
            check_time = _validate(data, allow_non_finite, work)
    except BaseException as e:
        if work is not None:
            work.close()
        _report(exchange, e)
        raise
    chunk_edges = _chunk_edges(chunk_edges, source)
    train_mask = _train_mask(source)
    started = []

    def write(tmp_dir: str, bar: tqdm) -> Dict[str, Any]:
        timings: Dict[str, float] = {}
        try:
            stage_start = time.perf_counter()
            if assignment is None:
                part, num_swapped = _assign_parts(
                    source, num_parts, method, seed,
                    train_mask if balance_train else None, bar, timings,
                    osp.dirname(out_dir), threads, work)
            else:
                part, num_swapped = assignment, 0
                bar.update(2)
            timings['assign'] = round(time.perf_counter() - stage_start, 3)
            stage_start = time.perf_counter()
            new_id, node_ptr = _relabel(part, num_parts)
            del part
            timings['relabel'] = round(time.perf_counter() - stage_start, 3)
        except BaseException as e:
            _report(exchange, e)
            raise
        _sync(exchange, ('ok', tmp_dir))
        started.append(True)
        exchange.broadcast(node_ptr)
        exchange.broadcast(new_id)
        bar.update(1)
        stage_start = time.perf_counter()
        stats = write_shards(tmp_dir, source, new_id, node_ptr, num_parts,
                             exchange, bar, chunk_edges, max_unit_edges,
                             _save_skeleton)
        write_json({'num_parts': num_parts, 'node_types': None,
                     'edge_types': None, 'node_offset': None,
                     'is_hetero': False, 'is_sorted': True},
                    osp.join(tmp_dir, META_FILE))
        timings['write'] = round(time.perf_counter() - stage_start, 3)
        manifest = _manifest(source, num_parts, method, seed,
                             balance_train, train_mask, num_swapped,
                             node_ptr, stats, timings)
        if work is not None:
            manifest['resumed'] = list(work.resumed)
            manifest['disk_bytes'] = {
                phase: sum(f['bytes'] for f in record['files'].values())
                for phase, record in work.phases.items()
                if record['files']}
        return manifest

    try:
        manifest = write_atomically(out_dir, write, 4 + num_parts,
                                     progress, start_time, check_time,
                                     overwrite,
                                     tmp_parent=None if work is None
                                     else work.root)
    except BaseException as e:
        if work is not None:
            work.close()  # kept if a new run can resume from it
        if started:  # the other writers wait for the outcome
            _report(exchange, e)
        raise
    if work is not None:
        work.remove()
    if exchange.world_size > 1:
        _sync(exchange, ('ok', None))
    return manifest


def _chunk_edges(chunk_edges: Optional[int], source: GraphSource) -> int:
    if chunk_edges is not None:
        return chunk_edges
    return min(DEFAULT_CHUNK_EDGES, max(1 << 20, source.num_edges // 16))


def _save_skeleton(obj: Any, path: str) -> None:
    # Looked up at call time: tests replace `save_file` to fail or stall
    # writes.
    save_file(obj, path)


def _sync(exchange: Any, mine: Tuple[str, Any]) -> Any:
    r"""Every writer's status (:obj:`('ok' | 'error', payload)`), gathered;
    raises if another writer failed; returns rank 0's payload."""
    items = exchange.gather_objects(mine)
    for rank, item in enumerate(items):
        if not (isinstance(item, tuple) and len(item) == 2):
            raise RuntimeError(f'Partition writer {rank} is out of step '
                               f'(sent {type(item).__name__})')
        if item[0] == 'error' and rank != exchange.rank:
            raise RuntimeError(f'Partition writer {rank} failed: {item[1]}')
    return items[0][1]


def _report(exchange: Any, error: BaseException) -> None:
    r"""Tells the other writers that this one failed (they raise too)."""
    if exchange.world_size == 1:
        return
    text = str(error).splitlines()[0] if str(error) else ''
    try:
        _sync(exchange, ('error', f'{type(error).__name__}: {text}'))
    except RuntimeError:
        pass  # another writer failed too; this one's error is raised


def _follow(data: Any, num_parts: int, exchange: Any,
            chunk_edges: Optional[int], max_unit_edges: int) -> None:
    r"""A writer of rank > 0: waits for rank 0's checks and assignment,
    writes its share of the shards, waits for the manifest."""
    error = None
    try:
        if isinstance(data, Data):
            source = source_of_data(data, True)[0]
        else:
            source = (data if isinstance(data, GraphOnDisk) else
                      GraphOnDisk(data)).source()
        chunk_edges = _chunk_edges(chunk_edges, source)
    except Exception as e:  # noqa: BLE001 - reported, then raised
        error = e
    text = '' if error is None else str(error).splitlines()[0]
    tmp_dir = _sync(exchange, ('ok', None) if error is None else
                    ('error', f'{type(error).__name__}: {text}'))
    if error is not None:
        raise error
    node_ptr = exchange.broadcast(torch.empty(num_parts + 1,
                                              dtype=torch.long))
    new_id = exchange.broadcast(torch.empty(source.num_nodes,
                                            dtype=torch.long))
    write_shards(tmp_dir, source, new_id, node_ptr, num_parts, exchange,
                 tqdm(disable=True), chunk_edges, max_unit_edges,
                 _save_skeleton)
    _sync(exchange, ('ok', None))  # rank 0 hashed and renamed the output
    return None


def _check_assignment(assignment: Any, num_nodes: int,
                      num_parts: int) -> Tensor:
    if not isinstance(assignment, Tensor) or assignment.dim() != 1 or \
            assignment.numel() != num_nodes or assignment.is_floating_point():
        raise ValueError(f"'assignment' must be an integer tensor of shape "
                         f"[{num_nodes}] (num_nodes)")
    assignment = assignment.long()
    low, high = int(assignment.min()), int(assignment.max())
    counts = torch.bincount(assignment.clamp(0, num_parts - 1),
                            minlength=num_parts)
    if low < 0 or high >= num_parts or int(counts.min()) == 0:
        raise ValueError(f"'assignment' must give every node a part in "
                         f"[0, {num_parts - 1}] and every part a node (got "
                         f"ids in [{low}, {high}])")
    return assignment


def _assign_parts(source: GraphSource, num_parts: int, method: str,
                  seed: int, balance_mask: Optional[Tensor], bar: tqdm,
                  timings: Dict[str, float], tmp_dir: str,
                  threads: Optional[int], work: Optional[WorkDir]
                  ) -> Tuple[Tensor, int]:
    r"""One part id per node
    (:func:`~pyg_sar.partition.assign.parts.assign_parts` on the source's
    edge chunks; KaMinPar's input file in :obj:`tmp_dir`) and the number of
    training-node swaps."""
    part, stats = assign_parts(source.edges, num_parts, method, seed,
                               balance_mask, threads=threads,
                               tmp_dir=tmp_dir, work=work,
                               progress_callback=bar.set_postfix_str)
    if work is not None:  # the shards need neither: free their disk
        work.discard(PARHIP_FILE, KAMINPAR_FILE)
    bar.update(2)
    timings.update(stats['timings'])
    return part, stats['num_swapped']


def _relabel(part: Tensor, num_parts: int) -> Tuple[Tensor, Tensor]:
    r"""New node ids, stable by part: :obj:`(new_id, node_ptr)`, part
    :obj:`i` owning :obj:`node_ptr[i]` to :obj:`node_ptr[i + 1] - 1`."""
    sizes = count_per_part(part, num_parts)
    node_ptr = torch.zeros(num_parts + 1, dtype=torch.long)
    torch.cumsum(sizes, dim=0, out=node_ptr[1:])
    new_id = torch.empty(part.numel(), dtype=torch.long)
    for i in range(num_parts):
        ids = (part == i).nonzero().view(-1)
        new_id[ids] = torch.arange(int(node_ptr[i]), int(node_ptr[i + 1]))
    return new_id, node_ptr


def _manifest(source: GraphSource, num_parts: int, method: str, seed: int,
              balance_train: bool, train_mask: Optional[Tensor],
              num_swapped: int, node_ptr: Tensor, stats: Dict[str, Any],
              timings: Dict[str, float]) -> Dict[str, Any]:
    part_sizes = node_ptr[1:] - node_ptr[:-1]
    edge_ptr = stats['edge_ptr']
    edge_sizes = edge_ptr[1:] - edge_ptr[:-1]
    train_counts = stats['train_counts'] if train_mask is not None else []
    num_edges, num_cut = source.num_edges, stats['num_cut']
    parts = [{
        'num_nodes': int(part_sizes[i]),
        'num_edges': int(edge_sizes[i]),
        'num_train_nodes': train_counts[i] if train_counts else None,
        'num_remote_edges': int(stats['remote_edges'][i]),
        'num_halo_nodes': stats['halo_nodes'][i],
    } for i in range(num_parts)]
    balance = {
        'nodes_max_over_mean': round(max_over_mean(part_sizes), 4),
        'edges_max_over_mean': round(max_over_mean(edge_sizes), 4),
    }
    if train_counts:
        balance['train_max_over_mean'] = round(
            max_over_mean(torch.tensor(train_counts)), 4)
    node_attrs, edge_attrs = source.node_attrs, source.edge_attrs
    y = node_attrs.get('y')
    return {
        **manifest_header(),
        'num_parts': num_parts,
        'method': method,
        'balance_train': bool(balance_train and train_mask is not None),
        'train_swaps': num_swapped,
        'seed': seed,
        'num_nodes': source.num_nodes,
        'num_edges': num_edges,
        'node_ptr': node_ptr.tolist(),
        'edge_ptr': edge_ptr.tolist(),
        'parts': parts,
        'edge_cut': {
            'count': num_cut,
            'fraction': round(num_cut / num_edges, 6) if num_edges else 0.0,
        },
        'balance': balance,
        'perm_file': PERM_FILE,
        'node_attr_names': list(node_attrs),
        'edge_attr_names': list(edge_attrs),
        'num_classes': class_count(None if y is None else (
            y if isinstance(y, Tensor) else _labels_for_count(y))),
        'source': {
            'num_nodes': source.num_nodes,
            'num_edges': num_edges,
            'node_attrs': {k: _info(v) for k, v in node_attrs.items()},
            'edge_attrs': {k: _info(v) for k, v in edge_attrs.items()},
            'graph_attrs': source.graph_attrs,
        },
        'time_s': timings,
    }


def _info(value: Any) -> Dict[str, Any]:
    return dict(shape=list(value.shape), dtype=str(torch_dtype(value)))


def _labels_for_count(y: Any) -> Tensor:
    r"""Labels on disk as a tensor for :func:`class_count`: a multi-label
    target needs only its shape, class ids their maximum (streamed)."""
    if y.ndim == 2 and y.shape[1] > 1 or y.dtype.kind not in 'iu':
        return torch.empty((0, ) + tuple(y.shape[1:]), dtype=torch_dtype(y)) \
            if y.shape[0] == 0 else torch.from_numpy(np.array(y[:1]))
    high = max((int(np.max(y[s:s + (1 << 24)]))
                for s in range(0, y.shape[0], 1 << 24)), default=-1)
    return torch.tensor([high])
