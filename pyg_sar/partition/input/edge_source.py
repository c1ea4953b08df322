"""Where the partitioner reads edges from: an :class:`EdgeSource` yields the
edge list in chunks of at most :obj:`chunk_edges` edges, so that no stage
needs the whole :obj:`edge_index` in memory at once. An in-memory
:obj:`edge_index` and the memory-mapped ``.npy`` files of a graph on disk
are both edge sources."""
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Tuple

import torch
from torch import Tensor

# Edges per chunk when a stage streams over the edge list: 16M edges are
# 256 MiB of int64 (src, dst) pairs.
DEFAULT_CHUNK_EDGES = 1 << 24


class EdgeSource:
    r"""A directed edge list of :obj:`num_edges` edges between
    :obj:`num_nodes` nodes, read in chunks.

    :meth:`chunks` yields :obj:`(start, src, dst)`: the id of the chunk's
    first edge and two int64 tensors of equal length, in edge order, the
    chunks together covering every edge exactly once. Ids lie in
    :obj:`[0, num_nodes)` (checked by whoever builds the source)."""

    num_nodes: int
    num_edges: int

    def chunks(self, chunk_edges: int = DEFAULT_CHUNK_EDGES
               ) -> Iterator[Tuple[int, Tensor, Tensor]]:
        raise NotImplementedError

    def chunk_range(self, start: int, end: int,
                    chunk_edges: int = DEFAULT_CHUNK_EDGES
                    ) -> Iterator[Tuple[int, Tensor, Tensor]]:
        r"""Like :meth:`chunks`, only the edges :obj:`start` to
        :obj:`end - 1` (a parallel writer's slice). This default filters
        :meth:`chunks`; sources that can seek override it."""
        for first, src, dst in self.chunks(chunk_edges):
            lo, hi = max(start, first), min(end, first + src.numel())
            if lo < hi:
                yield lo, src[lo - first:hi - first], dst[lo - first:hi - first]


class SeekableEdgeSource(EdgeSource):
    r"""An edge source that reads any range of edges directly
    (:meth:`chunk_range`); :meth:`chunks` is the range of all edges."""

    def chunks(self, chunk_edges: int = DEFAULT_CHUNK_EDGES
               ) -> Iterator[Tuple[int, Tensor, Tensor]]:
        return self.chunk_range(0, self.num_edges, chunk_edges)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(num_nodes={self.num_nodes}, '
                f'num_edges={self.num_edges})')


class TensorEdgeSource(SeekableEdgeSource):
    r"""An in-memory :obj:`edge_index` of shape :obj:`[2, num_edges]`."""

    def __init__(self, edge_index: Tensor, num_nodes: int):
        self.edge_index = edge_index
        self.num_nodes = int(num_nodes)
        self.num_edges = int(edge_index.size(1))

    def chunk_range(self, start: int, end: int,
                    chunk_edges: int = DEFAULT_CHUNK_EDGES
                    ) -> Iterator[Tuple[int, Tensor, Tensor]]:
        for first in range(start, end, chunk_edges):
            last = min(first + chunk_edges, end)
            yield (first, self.edge_index[0, first:last].long(),
                   self.edge_index[1, first:last].long())


class NpyEdgeSource(SeekableEdgeSource):
    r"""The :obj:`[2, num_edges]` integer array of an ``edge_index.npy``,
    memory-mapped (see :mod:`pyg_sar.partition.input.ondisk`): each chunk is
    read from disk when it is asked for, so only one chunk is in memory."""

    def __init__(self, array, num_nodes: int):
        self.array = array
        self.num_nodes = int(num_nodes)
        self.num_edges = int(array.shape[1])

    def chunk_range(self, start: int, end: int,
                    chunk_edges: int = DEFAULT_CHUNK_EDGES
                    ) -> Iterator[Tuple[int, Tensor, Tensor]]:
        import numpy as np
        for first in range(start, end, chunk_edges):
            last = min(first + chunk_edges, end)
            src = np.array(self.array[0, first:last], dtype=np.int64)
            dst = np.array(self.array[1, first:last], dtype=np.int64)
            release_pages(self.array)
            yield first, torch.from_numpy(src), torch.from_numpy(dst)


@dataclass
class GraphSource:
    r"""What the homogeneous writer reads: the edges as an
    :class:`EdgeSource`, and every node and edge attribute as a tensor or a
    (memory-mapped) NumPy array of :obj:`num_nodes` or :obj:`num_edges`
    rows, read a block of rows at a time (:func:`take_rows`)."""
    num_nodes: int
    edges: EdgeSource
    node_attrs: Dict[str, Any] = field(default_factory=dict)
    edge_attrs: Dict[str, Any] = field(default_factory=dict)
    graph_attrs: Dict[str, Any] = field(default_factory=dict)

    @property
    def num_edges(self) -> int:
        return self.edges.num_edges


def torch_dtype(value) -> torch.dtype:
    r"""The :class:`torch.dtype` of a tensor or a NumPy array."""
    if isinstance(value, Tensor):
        return value.dtype
    import numpy as np
    return torch.from_numpy(np.empty(0, dtype=value.dtype)).dtype


def release_pages(array) -> None:
    r"""Unmaps the pages of a memory-mapped array that this process has
    read (``madvise(MADV_DONTNEED)``; they stay in the page cache): file
    pages mapped into a process count in its resident set, so a pass over a
    memory-mapped file would otherwise grow it by the file's size."""
    mapping = getattr(array, '_mmap', None)
    if mapping is not None and hasattr(mapping, 'madvise'):
        import mmap
        mapping.madvise(mmap.MADV_DONTNEED)


def take_rows(value, index: Tensor) -> Tensor:
    r"""The rows :obj:`index` (int64, ascending for arrays on disk, so that
    pages are read in order) of a tensor or a NumPy array, as a new tensor.
    """
    if isinstance(value, Tensor):
        return value[index]
    import numpy as np
    rows = np.ascontiguousarray(value[index.numpy()])
    release_pages(value)
    return torch.from_numpy(rows)


def as_edge_source(edges, num_nodes: int) -> EdgeSource:
    r"""Returns :obj:`edges` if it is an :class:`EdgeSource`, else wraps an
    :obj:`edge_index` tensor."""
    if isinstance(edges, EdgeSource):
        return edges
    if isinstance(edges, Tensor):
        return TensorEdgeSource(edges, num_nodes)
    raise TypeError(f"Expected an EdgeSource or an edge_index tensor "
                    f"(got '{type(edges).__name__}')")


__all__ = ['EdgeSource', 'TensorEdgeSource', 'NpyEdgeSource',
           'GraphSource', 'as_edge_source', 'take_rows', 'torch_dtype',
           'release_pages',
           'DEFAULT_CHUNK_EDGES']
