"""Where the partitioner reads edges from: an :class:`EdgeSource` yields the
edge list in chunks of at most :obj:`chunk_edges` edges, so that no stage
needs the whole :obj:`edge_index` in memory at once. An in-memory
:obj:`edge_index` and the memory-mapped ``.npy`` files of a graph on disk
are both edge sources."""
from typing import Iterator, Tuple

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


class TensorEdgeSource(EdgeSource):
    r"""An in-memory :obj:`edge_index` of shape :obj:`[2, num_edges]`."""

    def __init__(self, edge_index: Tensor, num_nodes: int):
        self.edge_index = edge_index
        self.num_nodes = int(num_nodes)
        self.num_edges = int(edge_index.size(1))

    def chunks(self, chunk_edges: int = DEFAULT_CHUNK_EDGES
               ) -> Iterator[Tuple[int, Tensor, Tensor]]:
        for start in range(0, self.num_edges, chunk_edges):
            end = min(start + chunk_edges, self.num_edges)
            yield (start, self.edge_index[0, start:end].long(),
                   self.edge_index[1, start:end].long())

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(num_nodes={self.num_nodes}, '
                f'num_edges={self.num_edges})')


def as_edge_source(edges, num_nodes: int) -> EdgeSource:
    r"""Returns :obj:`edges` if it is an :class:`EdgeSource`, else wraps an
    :obj:`edge_index` tensor."""
    if isinstance(edges, EdgeSource):
        return edges
    if isinstance(edges, Tensor):
        return TensorEdgeSource(edges, num_nodes)
    raise TypeError(f"Expected an EdgeSource or an edge_index tensor "
                    f"(got '{type(edges).__name__}')")


__all__ = ['EdgeSource', 'TensorEdgeSource', 'as_edge_source',
           'DEFAULT_CHUNK_EDGES']
