r"""The symmetrized graph the partitioners cut, built with little memory.

:func:`symmetric_csr` streams an
:class:`~pyg_sar.partition.input.edge_source.EdgeSource` twice: once to
count degrees, once to place both directions of every edge (self loops
dropped) in one :obj:`col` array (int32 unless there are :math:`2^{31}`
nodes or more), then removes duplicate neighbors row by row
in bounded chunks, in place. The result, :class:`SymmetricCSR`, is the
symmetric adjacency sorted by :obj:`(row, col)` without self loops or
duplicates: about 8 bytes per input edge plus 16 bytes per node plus one
chunk at the peak (the in-memory :obj:`torch.unique` of both directions'
int64 codes needed about 80 bytes per edge). Its two passes are
:func:`symmetric_degrees` and :func:`symmetric_rows`, which builds any
range of rows alone: the out-of-core writer of KaMinPar's input
(:mod:`~pyg_sar.partition.assign.symmetric_file`) runs it range by range.

:func:`write_parhip` streams it to KaMinPar's ParHIP binary file, and
:class:`CsrView` reads it back (from memory or memory-mapped from that file)
a range of rows at a time, for the repair passes of
:mod:`~pyg_sar.partition.assign.repair`."""
import os
from typing import Iterator, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from pyg_sar.partition.input.edge_source import (DEFAULT_CHUNK_EDGES,
                                                 EdgeSource, release_pages)

PARHIP_HEADER_BYTES = 24
# ParHIP's offsets are byte positions in the file: 32-bit below this size.
PARHIP_32BIT_LIMIT = 2**32


class CsrView:
    r"""A symmetric adjacency read a range of rows at a time: :obj:`rowptr`
    (int64 tensor of :obj:`num_nodes + 1` entries) and :obj:`col` (a tensor
    or a (memory-mapped) NumPy array of integer neighbor ids).

    Args:
        rowptr (torch.Tensor): Row pointers, int64.
        col (torch.Tensor or numpy.ndarray): Neighbors of every row.
        chunk_edges (int, optional): Entries read per chunk.
    """

    def __init__(self, rowptr: Tensor, col, chunk_edges: int =
                 DEFAULT_CHUNK_EDGES):
        self.rowptr = rowptr
        self.col = col
        self.chunk_edges = max(int(chunk_edges), 1)

    @property
    def num_nodes(self) -> int:
        return self.rowptr.numel() - 1

    @property
    def num_entries(self) -> int:
        return int(self.rowptr[-1])

    def row_ranges(self) -> Iterator[Tuple[int, int]]:
        r"""Consecutive row ranges :obj:`(r0, r1)` of at most
        :obj:`chunk_edges` entries each (or one row, if longer)."""
        n, rowptr, r0 = self.num_nodes, self.rowptr, 0
        while r0 < n:
            end = int(rowptr[r0]) + self.chunk_edges
            r1 = int(torch.searchsorted(rowptr, end, right=True)) - 1
            r1 = min(max(r1, r0 + 1), n)
            yield r0, r1
            r0 = r1

    def chunks(self) -> Iterator[Tuple[int, int, Tensor]]:
        r"""Yields :obj:`(r0, r1, col)` per row range, :obj:`col` as int64."""
        for r0, r1 in self.row_ranges():
            e0, e1 = int(self.rowptr[r0]), int(self.rowptr[r1])
            chunk = self.col[e0:e1]
            if isinstance(chunk, Tensor):
                chunk = chunk.long()
            else:
                chunk = torch.from_numpy(np.array(chunk, dtype=np.int64))
                # The mapped file's pages would otherwise stay in this
                # process's resident set: a pass would grow it by the file.
                release_pages(self.col)
            yield r0, r1, chunk

    def neighbors_in_part(self, part: Tensor, target: int) -> Tensor:
        r"""Per node: the number of its neighbors in part :obj:`target`."""
        out = torch.zeros(self.num_nodes, dtype=torch.long)
        for r0, r1, col in self.chunks():
            hits = torch.zeros(col.numel() + 1, dtype=torch.long)
            torch.cumsum(part[col] == target, dim=0, out=hits[1:])
            ptr = self.rowptr[r0:r1 + 1] - self.rowptr[r0]
            out[r0:r1] = hits[ptr[1:]] - hits[ptr[:-1]]
        return out

    def edge_cut(self, part: Tensor) -> int:
        r"""The number of undirected edges between different parts."""
        cut = 0
        for r0, r1, col in self.chunks():
            deg = self.rowptr[r0 + 1:r1 + 1] - self.rowptr[r0:r1]
            own = torch.repeat_interleave(part[r0:r1], deg)
            cut += int((own != part[col]).sum())
        return cut // 2

    @classmethod
    def from_parhip(cls, path: str, chunk_edges: int = DEFAULT_CHUNK_EDGES
                    ) -> 'CsrView':
        r"""Memory-maps the adjacency of a ParHIP file written by
        :func:`write_parhip` (unweighted)."""
        version, n, m = np.fromfile(path, dtype=np.uint64, count=3).tolist()
        edge_dtype = np.uint32 if version & 4 else np.uint64
        node_dtype = np.uint32 if version & 8 else np.uint64
        base = PARHIP_HEADER_BYTES + (n + 1) * np.dtype(edge_dtype).itemsize
        expected = base + m * np.dtype(node_dtype).itemsize
        size = os.path.getsize(path)
        if size < expected:
            raise ValueError(f"ParHIP file '{path}' is {size} bytes; its "
                             f"header (n={n}, m={m}) needs {expected}")
        offsets = np.memmap(path, dtype=edge_dtype, mode='r',
                            offset=PARHIP_HEADER_BYTES, shape=(n + 1, ))
        rowptr = torch.from_numpy(
            (np.asarray(offsets, dtype=np.int64) - base) //
            np.dtype(node_dtype).itemsize)
        col = np.memmap(path, dtype=node_dtype, mode='r', offset=base,
                        shape=(m, )) if m else np.empty(0, node_dtype)
        return cls(rowptr, col, chunk_edges)


class SymmetricCSR(CsrView):
    r"""The symmetrized graph of :func:`symmetric_csr`: rows sorted, the
    neighbors of every row sorted and unique, no self loops. :obj:`col` is
    int32 when :obj:`num_nodes < 2**31`, else int64 (a view on the first
    :obj:`rowptr[-1]` entries of the fill buffer)."""


def _col_dtype(num_nodes: int) -> torch.dtype:
    return torch.int32 if num_nodes < 2**31 else torch.int64


def symmetric_rows(source: EdgeSource, r0: int, r1: int, deg: Tensor,
                   chunk_edges: int = DEFAULT_CHUNK_EDGES) -> Tensor:
    r"""The symmetrized rows :obj:`r0` to :obj:`r1 - 1` of :obj:`source`
    (both directions, self loops dropped), each sorted and unique, read
    from one pass over the source. :obj:`deg` holds the rows' entry counts
    before deduplication (:func:`symmetric_degrees`); it is overwritten with
    the counts after. Returns the rows' neighbors, concatenated (int32
    unless there are :math:`2^{31}` nodes or more): about 4 bytes per entry
    of the rows plus 16 bytes per row plus one chunk of work space.

    Args:
        source (EdgeSource): The directed edges.
        r0 (int): First row.
        r1 (int): One past the last row.
        deg (torch.Tensor): The rows' entry counts (int64, :obj:`r1 - r0`).
        chunk_edges (int, optional): Edges per chunk of the pass.
    """
    n = source.num_nodes
    chunk_edges = max(int(chunk_edges), 1)
    whole = r0 == 0 and r1 == n
    rowptr = torch.zeros(r1 - r0 + 1, dtype=torch.long)
    torch.cumsum(deg, dim=0, out=rowptr[1:])
    col = torch.empty(int(rowptr[-1]), dtype=_col_dtype(n))

    # Fill: every entry goes to its row's next free slot. Sorting the
    # chunk's rows gives each entry its rank within its row (the order
    # within a row does not matter: the dedupe pass sorts it).
    cursor = rowptr[:-1].clone()
    for _, src, dst in source.chunks(chunk_edges):
        keep = src != dst
        if whole:
            src, dst = src[keep].to(col.dtype), dst[keep].to(col.dtype)
            rows = torch.cat([src, dst])
            cols = torch.cat([dst, src])
        else:  # only the entries of the range's rows, in each direction
            out = keep & (src >= r0) & (src < r1)
            keep &= (dst >= r0) & (dst < r1)
            rows = torch.cat([src[out] - r0, dst[keep] - r0]).to(col.dtype)
            cols = torch.cat([dst[out], src[keep]]).to(col.dtype)
            del out
        del keep, src, dst
        rows, order = torch.sort(rows)
        index = torch.arange(rows.numel())
        is_first = torch.ones(rows.numel(), dtype=torch.bool)
        is_first[1:] = rows[1:] != rows[:-1]
        first = torch.cummax(torch.where(is_first, index, 0), dim=0).values
        col[cursor[rows] + (index - first)] = cols[order]
        del index, is_first, first, cols, order
        uniq, counts = torch.unique_consecutive(rows, return_counts=True)
        cursor[uniq] += counts
        del rows, uniq, counts
    del cursor

    # Dedupe row ranges of bounded size, compacting in place: the write
    # position never passes the read position.
    write = 0
    view = CsrView(rowptr, col, chunk_edges)
    for a, b in list(view.row_ranges()):
        e0, e1 = int(rowptr[a]), int(rowptr[b])
        seg = col[e0:e1].long()
        local = torch.repeat_interleave(torch.arange(b - a), deg[a:b])
        keys = torch.unique(local * n + seg)
        del seg, local
        local = torch.div(keys, n, rounding_mode='floor')
        col[write:write + keys.numel()] = (keys - local * n).to(col.dtype)
        deg[a:b] = torch.bincount(local, minlength=b - a)
        write += keys.numel()
        del keys, local
    return col[:write]


def symmetric_degrees(source: EdgeSource,
                      chunk_edges: int = DEFAULT_CHUNK_EDGES) -> Tensor:
    r"""Per node, its number of entries in the symmetrized graph before
    duplicates are removed: its in- plus out-degree without self loops
    (int64), from one pass over :obj:`source`."""
    deg = torch.zeros(source.num_nodes, dtype=torch.long)
    # Every per-chunk step is chunk-sized (no pass over all nodes per chunk).
    for _, src, dst in source.chunks(max(int(chunk_edges), 1)):
        keep = src != dst
        ones = torch.ones(int(keep.sum()), dtype=torch.long)
        deg.index_add_(0, src[keep], ones)
        deg.index_add_(0, dst[keep], ones)
        del keep, ones
    return deg


def symmetric_csr(source: EdgeSource,
                  chunk_edges: int = DEFAULT_CHUNK_EDGES) -> SymmetricCSR:
    r"""Symmetrizes the edges of :obj:`source` (both directions, self loops
    dropped, duplicates removed) into a :class:`SymmetricCSR`, reading the
    source twice a chunk at a time. Equal to the in-memory
    :obj:`torch.unique` of both directions' :obj:`row * n + col` codes.

    Args:
        source (EdgeSource): The directed edges.
        chunk_edges (int, optional): Edges per chunk of every pass.
    """
    n = source.num_nodes
    deg = symmetric_degrees(source, chunk_edges)
    col = symmetric_rows(source, 0, n, deg, chunk_edges)
    rowptr = torch.zeros(n + 1, dtype=torch.long)
    torch.cumsum(deg, dim=0, out=rowptr[1:])
    del deg
    return SymmetricCSR(rowptr, col, chunk_edges)


def parhip_format(num_nodes: int, num_entries: int) -> Tuple[int, int, int]:
    r"""The ParHIP file of an unweighted graph of :obj:`num_nodes` nodes and
    :obj:`num_entries` adjacency entries: :obj:`(version, node_bytes,
    edge_bytes)`, 32-bit node ids below :math:`2^{32}` nodes and 32-bit
    offsets while the file stays under :obj:`PARHIP_32BIT_LIMIT` bytes."""
    node_bytes = 4 if num_nodes < 2**32 else 8
    edge_bytes = 4
    if PARHIP_HEADER_BYTES + (num_nodes + 1) * 4 + \
            num_entries * node_bytes >= PARHIP_32BIT_LIMIT:
        edge_bytes = 8
    version = 1 | 2 | 16 | 32
    version |= 4 if edge_bytes == 4 else 0
    version |= 8 if node_bytes == 4 else 0
    return version, node_bytes, edge_bytes


def write_parhip(csr: CsrView, path: str) -> None:
    r"""Writes :obj:`csr` to KaMinPar's (and ParHIP's) binary graph format,
    a chunk at a time: a header of three uint64 (version, :obj:`n`,
    :obj:`m` = number of adjacency entries), the :obj:`n + 1` offsets as
    byte positions in the file, then the neighbor ids. The version's bits
    are inverted flags: 1 no edge weights, 2 no node weights, 4 32-bit
    offsets (only when the file is under 4 GiB), 8 32-bit node ids (below
    :math:`2^{32}` nodes), 16 and 32 32-bit weights."""
    n, m = csr.num_nodes, csr.num_entries
    version, node_bytes, edge_bytes = parhip_format(n, m)
    node_dtype = np.uint32 if node_bytes == 4 else np.uint64
    edge_dtype = np.uint32 if edge_bytes == 4 else np.uint64
    base = PARHIP_HEADER_BYTES + (n + 1) * edge_bytes
    step = max(csr.chunk_edges, 1)
    with open(path, 'wb') as f:
        f.write(np.array([version, n, m], dtype=np.uint64).tobytes())
        for lo in range(0, n + 1, step):
            offsets = csr.rowptr[lo:lo + step] * node_bytes + base
            f.write(offsets.numpy().astype(edge_dtype).tobytes())
        for lo in range(0, m, step):
            chunk = csr.col[lo:lo + step]
            if isinstance(chunk, Tensor):
                chunk = chunk.numpy()
            f.write(np.asarray(chunk).astype(node_dtype, copy=False)
                    .tobytes())


def as_idx_arrays(csr: CsrView, idx_width: int
                  ) -> Tuple[np.ndarray, Union[np.ndarray, Tensor]]:
    r""":obj:`(xadj, adjncy)` of :obj:`csr` as NumPy arrays of the given
    integer width (METIS's :obj:`idx_t`): no copy of an int32 :obj:`col`
    for a 32-bit METIS."""
    dtype = np.int32 if idx_width == 32 else np.int64
    if idx_width == 32 and csr.num_entries >= 2**31:
        raise ValueError(f"The symmetrized graph has {csr.num_entries} "
                         f"adjacency entries; this pymetis build (32-bit "
                         f"idx_t) takes fewer than 2**31; use "
                         f"method='kaminpar'")
    col = csr.col
    col = col.numpy() if isinstance(col, Tensor) else np.asarray(col)
    return (csr.rowptr.numpy().astype(dtype, copy=False),
            col.astype(dtype, copy=False))


__all__ = ['CsrView', 'SymmetricCSR', 'symmetric_csr', 'symmetric_rows',
           'symmetric_degrees', 'write_parhip', 'parhip_format',
           'as_idx_arrays', 'PARHIP_HEADER_BYTES', 'PARHIP_32BIT_LIMIT']
