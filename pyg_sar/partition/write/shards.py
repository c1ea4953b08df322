"""The shard writer of the homogeneous partitioner: :func:`write_shards`
writes the parts of a given relabelling, a unit (a range of a part's new
node ids) at a time, every file streamed to disk
(:class:`~pyg_sar.partition.write.stream_save.StreamedSave`). It runs as one
writer (:class:`LocalExchange`) or as K writers that exchange edges and
node rows with :obj:`all_to_all` (the :obj:`exchange` of
:func:`~pyg_sar.partition.partition_graph_parallel`); the files are the same
byte for byte.

Memory of one writer: the relabelling (8 bytes per node), one chunk of the
edge list, and one unit: about 64 bytes per in-edge of the unit
(:obj:`MAX_UNIT_EDGES`) plus its node rows (:obj:`MAX_UNIT_BYTES`). A part
split into several units costs one pass over the edge list per unit.
"""
import math
import os
import os.path as osp
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from tqdm.auto import tqdm

from pyg_sar.partition.input.edge_source import (DEFAULT_CHUNK_EDGES,
                                                 GraphSource, take_rows,
                                                 torch_dtype)
from pyg_sar.partition.layout import (EDGE_MAP_FILE, NODE_MAP_FILE,
                                      PERM_FILE, part_path)
from pyg_sar.partition.write.stream_save import StreamedSave


class LocalExchange:
    r"""The exchange of a single writer: every collective is the identity.
    :class:`pyg_sar.comm.ProcessGroupExchange` is the one of K writers
    (the same methods over the process group)."""
    rank = 0
    world_size = 1

    def all_to_all(self, tensors: Sequence[Tensor]) -> List[Tensor]:
        return list(tensors)

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        return tensor

    def gather_objects(self, obj: Any) -> List[Any]:
        return [obj]

    def broadcast(self, tensor: Tensor) -> Tensor:
        return tensor


# A part whose in-edges exceed this many is written in several units (ranges
# of its target nodes), each a pass over the edge list: the writer holds
# about 64 bytes per edge of one unit (ids, input ids, sort key and order,
# row/col).
MAX_UNIT_EDGES = 1 << 25
# The same for the node attribute rows of one unit (bytes).
MAX_UNIT_BYTES = 1 << 30


def _units(node_ptr: Tensor, edge_sizes: Tensor, row_bytes: int,
           max_unit_edges: int) -> List[List[Tuple[int, int]]]:
    r"""Per part, the ranges of new node ids written one at a time: the
    part's range split evenly so that a unit holds about
    :obj:`max_unit_edges` in-edges and :obj:`MAX_UNIT_BYTES` of node rows."""
    units = []
    for p in range(node_ptr.numel() - 1):
        lo, hi = int(node_ptr[p]), int(node_ptr[p + 1])
        count = max(1, math.ceil(int(edge_sizes[p]) / max_unit_edges),
                    math.ceil((hi - lo) * row_bytes / MAX_UNIT_BYTES))
        count = min(count, hi - lo)
        cuts = [lo + (hi - lo) * k // count for k in range(count + 1)]
        units.append(list(zip(cuts[:-1], cuts[1:])))
    return units


def _cat(pieces: List[Tensor], empty: Tensor) -> Tensor:
    return torch.cat(pieces) if pieces else empty


def _constant_record(out: StreamedSave, index: int, sizes: Tensor) -> None:
    for p, size in enumerate(sizes.tolist()):
        for start in range(0, size, 1 << 24):
            out.write(index, torch.full((min(1 << 24, size - start), ), p,
                                        dtype=torch.long))


def _write_maps(root: str, new_id: Tensor, node_ptr: Tensor,
                edge_ptr: Tensor, save: Optional[Callable] = None) -> None:
    r"""``node_map.pt``, ``edge_map.pt`` and ``perm.pt``, streamed (one
    part's worth of ids in memory at a time)."""
    num_parts = node_ptr.numel() - 1
    for name, ptr in ((NODE_MAP_FILE, node_ptr), (EDGE_MAP_FILE, edge_ptr)):
        with StreamedSave(torch.empty(int(ptr[-1]), dtype=torch.long),
                          osp.join(root, name), save) as out:
            _constant_record(out, 0, ptr[1:] - ptr[:-1])
    with StreamedSave(torch.empty(new_id.numel(), dtype=torch.long),
                      osp.join(root, PERM_FILE), save) as out:
        for p in range(num_parts):
            lo, hi = int(node_ptr[p]), int(node_ptr[p + 1])
            out.write(0, ((new_id >= lo) & (new_id < hi)).nonzero().view(-1))


class _PartFiles:
    r"""The three files of one part, open for streamed writing."""

    def __init__(self, root: str, p: int, node_ptr: Tensor,
                 edge_ptr: Tensor, source: GraphSource,
                 save: Optional[Callable] = None):
        part_dir = part_path(root, p)
        os.makedirs(part_dir)
        self.lo, self.hi = int(node_ptr[p]), int(node_ptr[p + 1])
        self.edge_start = int(edge_ptr[p])
        num_edges = int(edge_ptr[p + 1]) - self.edge_start

        def empty(value, rows):
            return torch.empty((rows, ) + tuple(value.shape[1:]),
                               dtype=torch_dtype(value))

        size = (source.num_nodes, source.num_nodes)
        self.graph = StreamedSave(
            {'edge_id': torch.empty(num_edges, dtype=torch.long),
             'row': torch.empty(num_edges, dtype=torch.long),
             'col': torch.empty(num_edges, dtype=torch.long),
             'size': size,
             # The input's edge ids (columns of its edge_index): pyg_sar's
             # own key, which PyG's LocalGraphStore does not read.
             'orig_edge_id': torch.empty(num_edges, dtype=torch.long)},
            osp.join(part_dir, 'graph.pt'), save)
        self.nodes = StreamedSave(
            {'global_id': torch.empty(self.hi - self.lo, dtype=torch.long),
             'feats': {k: empty(v, self.hi - self.lo)
                       for k, v in source.node_attrs.items()}},
            osp.join(part_dir, 'node_feats.pt'), save)
        self.edges = StreamedSave(
            {'global_id': torch.empty(num_edges, dtype=torch.long),
             'feats': {k: empty(v, num_edges)
                       for k, v in source.edge_attrs.items()}},
            osp.join(part_dir, 'edge_feats.pt'), save)
        self.edges_done = 0
        self.train = 0

    def close(self) -> None:
        for out in (self.graph, self.nodes, self.edges):
            out.close()


def write_shards(root: str, source: GraphSource, new_id: Tensor,
                 node_ptr: Tensor, num_parts: int, exchange: Any, bar: tqdm,
                 chunk_edges: int = DEFAULT_CHUNK_EDGES,
                 max_unit_edges: int = MAX_UNIT_EDGES,
                 save: Optional[Callable] = None) -> Dict[str, Any]:
    r"""Writes the parts of the relabelling :obj:`new_id` into :obj:`root`.

    Rank :obj:`r` of :obj:`exchange` reads edges and node rows of its slice
    (the :obj:`r`-th of :obj:`world_size` equal ranges of input ids) and
    writes parts :obj:`r, r + K, ...`; each unit (a range of a part's new
    node ids) gathers its in-edges and node rows from every rank with
    :obj:`all_to_all`, sorts the edges by :obj:`(new dst, new src)` (ties in
    input order) and appends them to the part's files. Rank 0 also writes
    the node and edge maps and the permutation. :obj:`save` writes each
    file's skeleton (see :class:`StreamedSave`). Returns the statistics of
    the manifest (on every rank)."""
    rank, world = exchange.rank, exchange.world_size
    N, P = source.num_nodes, num_parts
    E = source.num_edges
    e_lo, e_hi = rank * E // world, (rank + 1) * E // world
    n_lo, n_hi = rank * N // world, (rank + 1) * N // world
    bounds = node_ptr[1:].contiguous()
    edges = source.edges

    counts = torch.zeros(2 * P + 1, dtype=torch.long)
    for _, src, dst in edges.chunk_range(e_lo, e_hi, chunk_edges):
        dst_part = torch.searchsorted(bounds, new_id[dst], right=True)
        is_cut = torch.searchsorted(bounds, new_id[src],
                                    right=True) != dst_part
        counts[:P] += torch.bincount(dst_part, minlength=P)
        counts[P:2 * P] += torch.bincount(dst_part[is_cut], minlength=P)
        counts[2 * P] += int(is_cut.sum())
    counts = exchange.all_reduce_sum(counts)
    edge_ptr = torch.zeros(P + 1, dtype=torch.long)
    torch.cumsum(counts[:P], dim=0, out=edge_ptr[1:])

    node_attrs, edge_attrs = source.node_attrs, source.edge_attrs
    row_bytes = sum(math.prod(v.shape[1:]) * torch_dtype(v).itemsize
                    for v in node_attrs.values())
    units = _units(node_ptr, counts[:P], row_bytes, max_unit_edges)
    queues = [[(p, a, b) for p in range(q, P, world) for a, b in units[p]]
              for q in range(world)]
    if rank == 0:
        bar.set_postfix_str('write maps')
        _write_maps(root, new_id, node_ptr, edge_ptr, save)
        bar.update(1)

    long_empty = torch.empty(0, dtype=torch.long)
    edge_empty = [torch.empty((0, ) + tuple(v.shape[1:]),
                              dtype=torch_dtype(v))
                  for v in edge_attrs.values()]
    node_empty = [torch.empty((0, ) + tuple(v.shape[1:]),
                              dtype=torch_dtype(v))
                  for v in node_attrs.values()]
    has_train = 'train_mask' in node_attrs and \
        torch_dtype(node_attrs['train_mask']) == torch.bool and \
        node_attrs['train_mask'].ndim == 1
    train_index = list(node_attrs).index('train_mask') if has_train else -1
    files: Optional[_PartFiles] = None
    halo_mark: Optional[Tensor] = None
    done: Dict[int, Tuple[int, int]] = {}
    for step in range(max(len(queue) for queue in queues)):
        work = [queue[step] if step < len(queue) else None
                for queue in queues]
        # In-edges of every rank's unit from this rank's slice of edges.
        send: List[List[List[Tensor]]] = [[] for _ in range(world)]
        for start, src, dst in edges.chunk_range(e_lo, e_hi, chunk_edges):
            new_dst = new_id[dst]
            for q, unit in enumerate(work):
                if unit is None:
                    continue
                pick = ((new_dst >= unit[1]) &
                        (new_dst < unit[2])).nonzero().view(-1)
                if pick.numel() == 0:
                    continue
                edge_ids = pick + start
                send[q].append([new_dst[pick], new_id[src[pick]],
                                edge_ids] +
                               [take_rows(v, edge_ids)
                                for v in edge_attrs.values()])
        fields = []
        for k, empty in enumerate([long_empty] * 3 + edge_empty):
            outgoing = []
            for pieces in send:
                outgoing.append(_cat([piece[k] for piece in pieces], empty))
                for piece in pieces:
                    piece[k] = None  # keep one copy of the rows
            received = exchange.all_to_all(outgoing)
            del outgoing
            fields.append(_cat(received, empty))
            del received
        del send
        # Node rows of every rank's unit from this rank's slice of nodes.
        node_rows = []
        if node_attrs:
            slice_ids = new_id[n_lo:n_hi]
            picks = [None if unit is None else
                     ((slice_ids >= unit[1]) & (slice_ids < unit[2]))
                     .nonzero().view(-1) + n_lo for unit in work]
            for value, empty in zip(node_attrs.values(), node_empty):
                received = exchange.all_to_all(
                    [empty if pick is None else take_rows(value, pick)
                     for pick in picks])
                node_rows.append(_cat(received, empty))
            del picks
        unit = work[rank]
        if unit is None:
            continue
        p, a, b = unit
        if files is None:
            bar.set_postfix_str(f'write part {p}')
            files = _PartFiles(root, p, node_ptr, edge_ptr, source, save)
            if halo_mark is None:
                halo_mark = torch.zeros(N, dtype=torch.bool)
        new_dst, new_src = fields[0], fields[1]
        order = torch.argsort((new_dst - a) * N + new_src, stable=True)
        row, col = new_src[order], new_dst[order]
        start = files.edge_start + files.edges_done
        edge_id = torch.arange(start, start + row.numel())
        files.edges_done += row.numel()
        for k, value in enumerate((edge_id, row, col, fields[2][order])):
            files.graph.write(k, value)
        files.edges.write(0, edge_id)
        for k, value in enumerate(fields[3:]):
            files.edges.write(k + 1, value[order])
        remote = (row < files.lo) | (row >= files.hi)
        halo_mark[row[remote]] = True
        del fields, order, row, col, edge_id, new_dst, new_src, remote
        files.nodes.write(0, torch.arange(a, b))
        for k, value in enumerate(node_rows):
            if value.size(0) != b - a:
                raise RuntimeError(f'Unit [{a}, {b}) of part {p} got '
                                   f'{value.size(0)} node rows')
            files.nodes.write(k + 1, value)
        if train_index >= 0:
            files.train += int(node_rows[train_index].sum())
        del node_rows
        if b == files.hi:  # the part's last unit
            files.close()
            done[p] = (int(halo_mark.sum()), files.train)
            halo_mark.zero_()
            files = None
            bar.update(1)
    merged: Dict[int, Tuple[int, int]] = {}
    for q, part_stats in enumerate(exchange.gather_objects(done)):
        if not isinstance(part_stats, dict):
            raise RuntimeError(f'Partition writer {q} failed while writing '
                               f'(sent {part_stats!r})')
        merged.update(part_stats)
    return {
        'edge_ptr': edge_ptr,
        'remote_edges': counts[P:2 * P],
        'num_cut': int(counts[2 * P]),
        'halo_nodes': [merged[p][0] for p in range(P)],
        'train_counts': [merged[p][1] for p in range(P)] if has_train
        else [],
    }
