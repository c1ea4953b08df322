r"""A homogeneous graph on disk, read memory-mapped by the partitioner.

Layout of a graph directory (written by :func:`save_graph`, read by
:class:`GraphOnDisk`; every array a NumPy ``.npy`` file, C order, little
endian, no pickled objects)::

    graph/
        graph.json        # {"format": "pyg_sar.graph", "version": 1,
                          #  "num_nodes": N, "num_edges": E,
                          #  "edge_index": "edge_index.npy",
                          #  "node_attrs": {"x": "x.npy", ...},
                          #  "edge_attrs": {"edge_attr": "edge_attr.npy"},
                          #  "graph_attrs": {...}}   (JSON scalars)
        edge_index.npy    # int64 or int32, shape [2, E]: row 0 the
                          # sources, row 1 the targets (each contiguous)
        x.npy             # node attributes: first dimension N
        y.npy
        train_mask.npy    # bool [N]
        edge_attr.npy     # edge attributes: first dimension E

Attribute names are letters, digits and ``_``; file names are plain names
ending in ``.npy`` inside the directory (a path that leaves it, a symbolic
link included, is refused). Allowed dtypes: bool, uint8, int8, int16, int32,
int64, float16, float32, float64, complex64, complex128.

:class:`GraphOnDisk` checks the header of every file when opened (one line
each: a file shorter or longer than its header says, a wrong shape, a
dtype not allowed, Fortran order, big endian), and :meth:`GraphOnDisk.validate`
streams over the data before any shard is written: node ids out of range,
NaN or inf in floating attributes (unless :obj:`allow_non_finite`), negative
labels on nodes of a mask. Nothing is unpickled (``allow_pickle=False``
semantics: object dtypes are refused at the header).

:func:`write_synthetic_graph` writes a large random graph chunk by chunk
without holding it (for the scale benchmark).
"""
import json
import math
import os
import os.path as osp
import re
from contextlib import contextmanager
from typing import Any, Dict, Iterable, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from pyg_sar.partition.input.data_source import split_attributes
from pyg_sar.partition.input.edge_source import (GraphSource,
                                                 NpyEdgeSource,
                                                 release_pages, torch_dtype)
from pyg_sar.partition.input.finite import non_finite_rows, sum_is_finite

GRAPH_FILE = 'graph.json'
GRAPH_FORMAT = 'pyg_sar.graph'
GRAPH_VERSION = 1
ALLOWED_DTYPES = ('bool', 'uint8', 'int8', 'int16', 'int32', 'int64',
                  'float16', 'float32', 'float64', 'complex64', 'complex128')
_NAME = re.compile(r'^[A-Za-z0-9_]+$')
_FILE = re.compile(r'^[A-Za-z0-9_.-]+\.npy$')
# Elements per block of the streamed checks and writes (8 MiB of float64).
_BLOCK_ELEMENTS = 1 << 20
_MAX_JSON_BYTES = 1 << 24


# Writing ######################################################################


class NpyWriter:
    r"""Writes one ``.npy`` file of a known :obj:`shape` and :obj:`dtype` in
    pieces (:meth:`write` at any element offset, :func:`os.pwrite`), into a
    temporary name renamed into place by :meth:`finish`: a reader never sees
    a half-written file."""

    def __init__(self, path: str, shape: Tuple[int, ...], dtype):
        self.path, self.shape = path, tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.tmp = f'{path}.tmp-{os.getpid()}'
        header = {'descr': np.lib.format.dtype_to_descr(self.dtype),
                  'fortran_order': False, 'shape': self.shape}
        with open(self.tmp, 'wb') as f:
            np.lib.format.write_array_header_2_0(f, header)
            self.offset = f.tell()
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        os.truncate(self.tmp, self.offset + self.nbytes)
        self.fd = os.open(self.tmp, os.O_WRONLY)

    def write(self, element_offset: int, values) -> None:
        if isinstance(values, Tensor):
            values = values.numpy()
        data = np.ascontiguousarray(values, dtype=self.dtype)
        view = memoryview(data.reshape(-1).view(np.uint8))
        start = self.offset + element_offset * self.dtype.itemsize
        if element_offset < 0 or start + len(view) > self.offset + \
                self.nbytes:
            raise ValueError(f"Write past the end of '{self.path}'")
        pos = 0
        while pos < len(view):
            pos += os.pwrite(self.fd, view[pos:pos + (1 << 30)], start + pos)

    def finish(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        os.close(self.fd)
        if osp.exists(self.tmp):
            os.remove(self.tmp)


def _write_rows(path: str, value, block_rows: Optional[int] = None) -> None:
    r"""Writes the tensor or array :obj:`value` to :obj:`path` a block of
    rows at a time."""
    if isinstance(value, Tensor):
        if value.dtype == torch.bfloat16:
            raise ValueError(f"Cannot write '{osp.basename(path)}': dtype "
                             f"torch.bfloat16 has no .npy form; convert it "
                             f"to float32")
        value = value.detach().cpu()
    shape = tuple(value.shape)
    dtype = value.numpy().dtype if isinstance(value, Tensor) else value.dtype
    writer = NpyWriter(path, shape, dtype)
    try:
        rows = shape[0] if shape else 1
        row_elems = max(1, math.prod(shape[1:]))
        step = block_rows or max(1, _BLOCK_ELEMENTS // row_elems)
        flat = value.reshape(rows, -1) if shape else value.reshape(1, 1)
        for start in range(0, rows, step):
            block = flat[start:start + step]
            if isinstance(block, Tensor):
                block = block.contiguous().numpy()
            writer.write(start * row_elems, block)
        writer.finish()
    except BaseException:
        writer.abort()
        raise


def _write_json_atomically(obj: Any, path: str) -> None:
    tmp = f'{path}.tmp-{os.getpid()}'
    with open(tmp, 'w') as f:
        json.dump(obj, f, indent=2)
        f.write('\n')
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_graph(data, root: str) -> str:
    r"""Writes the homogeneous :class:`~torch_geometric.data.Data`
    :obj:`data` to the graph directory :obj:`root` (layout above): one
    ``.npy`` per tensor, written a block of rows at a time into a temporary
    name and renamed, then ``graph.json`` last (a directory without it is
    not a graph). Node and edge attributes are told apart as
    :func:`~pyg_sar.partition.partition_graph` does. Returns :obj:`root`."""
    num_nodes, edge_index, node_attrs, edge_attrs, graph_attrs = \
        split_attributes(data)
    root = osp.abspath(os.fspath(root))
    os.makedirs(root, exist_ok=True)
    if osp.exists(osp.join(root, GRAPH_FILE)):
        raise FileExistsError(f"'{root}' already holds a graph "
                              f"('{GRAPH_FILE}'); choose an empty directory")
    meta: Dict[str, Any] = {
        'format': GRAPH_FORMAT, 'version': GRAPH_VERSION,
        'num_nodes': int(num_nodes), 'num_edges': int(edge_index.size(1)),
        'edge_index': 'edge_index.npy', 'node_attrs': {}, 'edge_attrs': {},
        'graph_attrs': {k: v for k, v in graph_attrs.items()
                        if isinstance(v, (bool, int, float, str))
                        or v is None},
    }
    _write_rows(osp.join(root, 'edge_index.npy'), edge_index)
    for kind, attrs in (('node_attrs', node_attrs), ('edge_attrs',
                                                     edge_attrs)):
        for key, value in attrs.items():
            if not _NAME.match(key):
                raise ValueError(f"Attribute name '{key}' cannot be a file "
                                 f"name; expected letters, digits and '_'")
            name = f'{key}.npy' if kind == 'node_attrs' else \
                f'edge__{key}.npy'
            _write_rows(osp.join(root, name), value)
            meta[kind][key] = name
    _write_json_atomically(meta, osp.join(root, GRAPH_FILE))
    return root


def write_synthetic_graph(root: str, num_nodes: int, avg_degree: int = 20,
                          num_features: int = 16, num_classes: int = 16,
                          seed: int = 0, chunk_nodes: int = 1 << 20,
                          feature_dtype=np.float32) -> str:
    r"""Writes a random graph of :obj:`num_nodes` nodes and about
    :obj:`num_nodes * avg_degree` directed edges to the graph directory
    :obj:`root`, a chunk of :obj:`chunk_nodes` nodes at a time (memory
    bounded by the chunk, whatever the graph's size).

    Not :func:`pyg_sar.datasets.synthetic_graph`'s distribution: every node
    gets :obj:`avg_degree` in-edges, half from nodes of its own community
    (blocks of 1,024 consecutive ids), half from anywhere, so that a
    partitioner finds a cut well below random's. Labels are the community id
    modulo :obj:`num_classes`, features Gaussian around a class centre;
    ``train_mask`` holds 10% of the nodes."""
    root = osp.abspath(os.fspath(root))
    os.makedirs(root, exist_ok=True)
    num_edges = num_nodes * avg_degree
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((num_classes, num_features)) \
        .astype(feature_dtype)
    writers = {
        'edge_index': NpyWriter(osp.join(root, 'edge_index.npy'),
                                (2, num_edges), np.int64),
        'x': NpyWriter(osp.join(root, 'x.npy'), (num_nodes, num_features),
                       feature_dtype),
        'y': NpyWriter(osp.join(root, 'y.npy'), (num_nodes, ), np.int64),
        'train_mask': NpyWriter(osp.join(root, 'train_mask.npy'),
                                (num_nodes, ), np.bool_),
    }
    block = 1024
    with npy_writers(writers):
        for start in range(0, num_nodes, chunk_nodes):
            end = min(start + chunk_nodes, num_nodes)
            count = end - start
            dst = np.repeat(np.arange(start, end, dtype=np.int64),
                            avg_degree)
            local = rng.random(dst.size) < 0.5
            comm_start = (dst // block) * block
            comm_size = np.minimum(block, num_nodes - comm_start)
            src = np.where(
                local, comm_start + (rng.random(dst.size) * comm_size)
                .astype(np.int64), rng.integers(0, num_nodes, dst.size))
            del local, comm_start, comm_size
            offset = start * avg_degree
            writers['edge_index'].write(offset, src)
            writers['edge_index'].write(num_edges + offset, dst)
            del src, dst
            y = (np.arange(start, end) // block) % num_classes
            x = centres[y] + rng.standard_normal(
                (count, num_features)).astype(feature_dtype)
            writers['x'].write(start * num_features, x)
            writers['y'].write(start, y)
            writers['train_mask'].write(start, rng.random(count) < 0.1)
    write_graph_json(root, num_nodes, num_edges,
                     {'x': 'x.npy', 'y': 'y.npy',
                      'train_mask': 'train_mask.npy'})
    return root


@contextmanager
def npy_writers(writers: Dict[str, NpyWriter]):
    r"""Runs the body that fills :obj:`writers` (:class:`NpyWriter`
    objects by name); then renames every file into place, or, if anything
    fails, removes the temporary files of those not yet in place."""
    try:
        yield writers
        for w in writers.values():
            w.finish()
    except BaseException:
        for w in writers.values():
            if w.fd is not None and osp.exists(w.tmp):
                try:
                    w.abort()
                except OSError:
                    pass
        raise


def write_graph_json(root: str, num_nodes: int, num_edges: int,
                     node_attrs: Dict[str, str],
                     edge_attrs: Optional[Dict[str, str]] = None) -> None:
    r"""Writes ``graph.json`` of a graph directory whose files are written
    (last, atomically): :obj:`node_attrs` and :obj:`edge_attrs` map
    attribute names to file names in :obj:`root`."""
    meta = {'format': GRAPH_FORMAT, 'version': GRAPH_VERSION,
            'num_nodes': int(num_nodes), 'num_edges': int(num_edges),
            'edge_index': 'edge_index.npy', 'node_attrs': dict(node_attrs),
            'edge_attrs': dict(edge_attrs or {}), 'graph_attrs': {}}
    _write_json_atomically(meta, osp.join(root, GRAPH_FILE))


# Reading ######################################################################


def _inside(root: str, name: Any, what: str) -> str:
    if not isinstance(name, str) or not _FILE.match(name) or \
            name.startswith('.'):
        raise ValueError(f"'{osp.join(root, GRAPH_FILE)}': {what} file "
                         f"{name!r} is not a plain '.npy' file name")
    path = osp.join(root, name)
    real_root = osp.realpath(root)
    if osp.dirname(osp.realpath(path)) != real_root:
        raise ValueError(f"'{path}' ({what}) leads outside the graph "
                         f"directory '{root}'")
    if not osp.isfile(path):
        raise FileNotFoundError(f"'{path}' ({what}) is missing")
    return path


def open_npy(path: str, what: str):
    r"""Memory-maps the ``.npy`` file :obj:`path` read-only after checking
    its header against the file: a one-line :class:`ValueError` names a
    truncated or overlong file, a dtype not in :obj:`ALLOWED_DTYPES`, big
    endian data or Fortran order. Nothing is unpickled."""
    size = os.stat(path).st_size
    with open(path, 'rb') as f:
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(
                    f, max_header_size=1 << 16)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(
                    f, max_header_size=1 << 16)
            else:
                raise ValueError(f'version {version}')
        except Exception as e:  # noqa: BLE001 - NumPy raises several kinds
            raise ValueError(f"'{path}' ({what}) is not a readable .npy file "
                             f"({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})"
                             ) from None
        offset = f.tell()
    if dtype.hasobject or dtype.name not in ALLOWED_DTYPES:
        raise ValueError(f"'{path}' ({what}) has dtype {dtype}; expected "
                         f"one of {', '.join(ALLOWED_DTYPES)}")
    if dtype.byteorder == '>':
        raise ValueError(f"'{path}' ({what}) is big endian; expected little "
                         f"endian")
    if fortran and len(shape) > 1:
        raise ValueError(f"'{path}' ({what}) is in Fortran order; expected "
                         f"C order (np.ascontiguousarray)")
    expected = offset + math.prod(shape) * dtype.itemsize
    if size != expected:
        state = 'truncated' if size < expected else 'longer than its header'
        raise ValueError(f"'{path}' ({what}) is {state}: {size:,} bytes, "
                         f"its header (shape {list(shape)}, {dtype}) says "
                         f"{expected:,}")
    if math.prod(shape) == 0:
        return np.empty(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode='r', offset=offset, shape=shape)


class GraphOnDisk:
    r"""A graph directory (layout in :mod:`pyg_sar.partition.input.ondisk`),
    every array memory-mapped read-only. Opening checks ``graph.json`` and
    every file's header and size; :meth:`validate` streams over the data.

    Args:
        root (str or os.PathLike): The graph directory.
    """

    def __init__(self, root):
        self.root = osp.abspath(os.fspath(root))
        meta_path = osp.join(self.root, GRAPH_FILE)
        if not osp.isfile(meta_path):
            raise FileNotFoundError(f"'{meta_path}' not found; is "
                                    f"'{self.root}' a graph directory "
                                    f"(pyg_sar.partition.input.ondisk."
                                    f"save_graph)?")
        if os.stat(meta_path).st_size > _MAX_JSON_BYTES:
            raise ValueError(f"'{meta_path}' is larger than "
                             f"{_MAX_JSON_BYTES} bytes")
        try:
            with open(meta_path, 'rb') as f:
                meta = json.loads(f.read().decode('utf-8'))
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"'{meta_path}' is not valid JSON ({e})") \
                from None
        self.meta = meta
        self._check_meta(meta, meta_path)
        self.num_nodes = meta['num_nodes']
        self.num_edges = meta['num_edges']
        path = _inside(self.root, meta['edge_index'], 'edge_index')
        self.edge_index = open_npy(path, 'edge_index')
        if self.edge_index.dtype.name not in ('int64', 'int32') or \
                self.edge_index.shape != (2, self.num_edges):
            raise ValueError(
                f"'{path}' has shape {list(self.edge_index.shape)} and dtype "
                f"{self.edge_index.dtype}; expected [2, {self.num_edges}] "
                f"(num_edges) of int64 or int32")
        self.node_attrs = self._open_attrs('node_attrs', self.num_nodes,
                                           'num_nodes')
        self.edge_attrs = self._open_attrs('edge_attrs', self.num_edges,
                                           'num_edges')
        self.graph_attrs = dict(meta.get('graph_attrs') or {})

    @staticmethod
    def _check_meta(meta: Any, path: str) -> None:
        def bad(msg: str) -> ValueError:
            return ValueError(f"'{path}': {msg}")

        if not isinstance(meta, dict) or meta.get('format') != GRAPH_FORMAT:
            raise bad(f"'format' is not '{GRAPH_FORMAT}'")
        if meta.get('version') != GRAPH_VERSION:
            raise bad(f"'version' is {meta.get('version')!r}; expected "
                      f"{GRAPH_VERSION}")
        for key in ('num_nodes', 'num_edges'):
            value = meta.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or \
                    value < (1 if key == 'num_nodes' else 0):
                raise bad(f"'{key}' is {value!r}; expected a "
                          f"{'positive' if key == 'num_nodes' else 'non-negative'}"
                          f" integer")
        for key in ('node_attrs', 'edge_attrs', 'graph_attrs'):
            value = meta.get(key, {})
            if not isinstance(value, dict):
                raise bad(f"'{key}' must be an object")
            if key != 'graph_attrs':
                for name in value:
                    if not _NAME.match(name) or name in ('edge_index',
                                                         'num_nodes'):
                        raise bad(f"attribute name {name!r} is not allowed")
        both = set(meta.get('node_attrs', {})) & set(meta.get('edge_attrs',
                                                              {}))
        if both:
            raise bad(f"{sorted(both)} are both node and edge attributes")

    def _open_attrs(self, kind: str, rows: int, rows_name: str
                    ) -> Dict[str, np.ndarray]:
        out = {}
        for key, name in self.meta.get(kind, {}).items():
            what = f"{kind[:4]} attribute '{key}'"
            path = _inside(self.root, name, what)
            array = open_npy(path, what)
            if array.ndim == 0 or array.shape[0] != rows:
                raise ValueError(
                    f"'{path}' ({what}) has shape {list(array.shape)}; "
                    f"expected first dimension {rows_name}={rows}")
            if key.endswith('_mask') and kind == 'node_attrs' and (
                    array.dtype != np.bool_ or array.ndim != 1):
                raise ValueError(
                    f"'{path}' ({what}) has shape {list(array.shape)} and "
                    f"dtype {array.dtype}; a mask must be bool [{rows}]")
            out[key] = array
        return out

    def validate(self, allow_non_finite: bool = False,
                 chunk_edges: int = 1 << 20) -> None:
        r"""Streams over the data: every node id in :obj:`[0, num_nodes)`,
        no NaN or inf in floating attributes (unless
        :obj:`allow_non_finite`), no negative label :obj:`y` on a node of a
        mask. Raises a one-line :class:`ValueError` naming the file."""
        source = self.edge_source()
        n = self.num_nodes
        path = osp.join(self.root, self.meta['edge_index'])
        for start, src, dst in source.chunks(chunk_edges):
            for row, ids in ((0, src), (1, dst)):
                if ids.numel() == 0 or (int(ids.min()) >= 0
                                        and int(ids.max()) < n):
                    continue
                bad = (ids < 0) | (ids >= n)
                if bool(bad.any()):
                    at = int(bad.nonzero()[0, 0])
                    raise ValueError(
                        f"'{path}' holds node id {int(ids[at])} at "
                        f"[{row}, {start + at}], outside the valid range "
                        f"[0, {n - 1}] for num_nodes={n}")
        if not allow_non_finite:
            for kind, attrs in (('Node', self.node_attrs),
                                ('Edge', self.edge_attrs)):
                for key, array in attrs.items():
                    _check_finite_streamed(kind, key, array)
        _check_labels_streamed(self.node_attrs)

    def edge_source(self) -> NpyEdgeSource:
        return NpyEdgeSource(self.edge_index, self.num_nodes)

    def source(self) -> GraphSource:
        return GraphSource(self.num_nodes, self.edge_source(),
                           dict(self.node_attrs), dict(self.edge_attrs),
                           dict(self.graph_attrs))

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}('{self.root}', num_nodes="
                f"{self.num_nodes}, num_edges={self.num_edges}, node_attrs="
                f"{list(self.node_attrs)}, edge_attrs="
                f"{list(self.edge_attrs)})")


def _row_blocks(array, step_elements: int = _BLOCK_ELEMENTS
                ) -> Iterable[Tuple[int, Tensor]]:
    rows = array.shape[0]
    row_elems = max(1, math.prod(array.shape[1:]))
    step = max(1, step_elements // row_elems)
    for start in range(0, rows, step):
        block = np.array(array[start:start + step])
        release_pages(array)
        yield start, torch.from_numpy(block)


def _check_finite_streamed(kind: str, key: str, array) -> None:
    if not torch_dtype(array).is_floating_point and \
            not torch_dtype(array).is_complex:
        return
    num_bad, first, has_nan, has_inf = 0, -1, False, False
    for start, block in _row_blocks(array):
        if sum_is_finite(block):
            continue
        count, at, nan, inf = non_finite_rows(block)
        if count and first < 0:
            first = start + at
        num_bad += count
        has_nan, has_inf = has_nan or nan, has_inf or inf
    if num_bad:
        values = ' and '.join(name for name, present in (
            ('NaN', has_nan), ('inf', has_inf)) if present)
        raise ValueError(
            f"{kind} attribute '{key}' has {values} values in {num_bad:,} "
            f"of {array.shape[0]:,} rows (first: input {kind.lower()} "
            f"{first}); fix them (e.g. np.nan_to_num) or pass "
            f"allow_non_finite=True (pyg-sar partition --allow-non-finite) "
            f"to partition anyway")


def _check_labels_streamed(node_attrs: Dict[str, Any]) -> None:
    r""":func:`pyg_sar.partition.input.checks.check_labels`, a block of
    rows at a time."""
    y = node_attrs.get('y')
    if y is None or y.dtype.kind not in 'iu' or not (
            y.ndim == 1 or (y.ndim == 2 and y.shape[1] == 1)):
        return
    masks = {k: v for k, v in node_attrs.items()
             if k.endswith('_mask') and v.dtype == np.bool_ and v.ndim == 1}
    for key, mask in masks.items():
        count, first, label = 0, -1, 0
        for start, block in _row_blocks(y):
            negative = block.view(-1) < 0
            if not bool(negative.any()):
                continue
            m = torch.from_numpy(np.array(mask[start:start + block.size(0)]))
            release_pages(mask)
            bad = negative & m
            hits = int(bad.sum())
            if hits and first < 0:
                at = int(bad.nonzero()[0, 0])
                first, label = start + at, int(block.view(-1)[at])
            count += hits
        if count:
            raise ValueError(
                f"Node attribute 'y' holds the negative label {label} on "
                f"{count:,} nodes of '{key}' (first: input node {first}); "
                f"expected a class id >= 0 on every node of a mask: fix "
                f"those labels or remove the nodes from the mask")


__all__ = ['GraphOnDisk', 'save_graph', 'write_synthetic_graph', 'NpyWriter',
           'npy_writers', 'write_graph_json',
           'open_npy', 'GRAPH_FILE']
