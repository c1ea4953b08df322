"""Edge blocks of a :class:`~pyg_sar.DistGraph`: the in-edges of one
worker from one source partition (:class:`EdgeBlock`), cut into runs of
destination-sorted edges (:class:`EdgeChunk`) that the SAR engine aggregates
in turn, with the CSR layouts of its sparse products cached per chunk."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar.utils.device import power_of_two_at_most


@dataclass
class EdgeChunk:
    """A run of at most ``chunk_size`` edges of one block, sorted by
    destination, so that it touches destination rows ``[row_start, row_end)``.

    ``src`` indexes the block's source table, ``dst`` is the local destination
    id, and ``edge_pos`` the position of each edge in the graph's edge order
    (where edge-level tensors such as ``edge_weight`` are indexed).
    """
    src: Tensor
    dst: Tensor
    edge_pos: Tensor
    row_start: int
    row_end: int
    # Whether csr() keeps its row pointer (a halo slice's chunk spans most
    # destination rows with few edges: its pointer is rebuilt per use).
    cache_csr: bool = True
    _csr: Optional[Tuple[Tensor, Tensor]] = None
    _csr_t: Optional[Tuple[Tensor, Tensor, Tensor]] = None
    # The chunks of the same cut of the block, this one among them (their
    # transposed CSRs are built together).
    family: Optional[List['EdgeChunk']] = field(default=None, repr=False,
                                                 compare=False)

    @property
    def num_edges(self) -> int:
        return int(self.src.numel())

    def csr(self) -> Tuple[Tensor, Tensor]:
        """``(crow, col)`` of the chunk's rows (destinations) over the block's
        source table; values are in edge order."""
        if self._csr is not None:
            return self._csr
        rows = self.dst - self.row_start
        # The row pointer takes the columns' dtype (int32 where ids fit).
        crow = torch.zeros(self.row_end - self.row_start + 1,
                           dtype=self.src.dtype, device=self.dst.device)
        crow[1:] = torch.bincount(
            rows, minlength=self.row_end - self.row_start).cumsum(0)
        if self.cache_csr:
            self._csr = (crow, self.src)
        return crow, self.src

    def csr_transposed(self, num_src: int, with_perm: bool = True
                       ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """``(crow, col, perm)`` of the transposed chunk: rows are sources,
        columns destination rows; ``perm`` orders edge values accordingly
        (``None`` unless ``with_perm``: unweighted products need none).
        Kept for the backward of every epoch, so stored as int32 where the
        edge and row counts fit (4 bytes per edge, 8 with ``perm``). The
        first call builds those of every chunk of the same cut (its
        ``family``) into one buffer (:func:`_transpose_family`)."""
        if self._csr_t is None or (with_perm and self._csr_t[2] is None):
            _transpose_family(self.family or [self], num_src, with_perm)
        return self._csr_t


def _transpose_family(chunks: List[EdgeChunk], num_src: int,
                      with_perm: bool) -> None:
    """Sets the transposed CSR of every chunk in ``chunks`` (see
    :meth:`EdgeChunk.csr_transposed`) as views of one index buffer.

    They live as long as the graph, while the engine's per-chunk
    temporaries come and go around them: built chunk by chunk, each set
    of small tensors would sit between freed temporaries in the C heap,
    whose holes a later chunk's temporaries then wander through (resident
    again after every trim). One buffer per cut is one allocation, mapped
    apart from the heap once it is large (:mod:`pyg_sar.utils.malloc`)."""
    dtype = index_dtype(max([num_src] + [max(c.num_edges,
                                             c.row_end - c.row_start)
                                         for c in chunks]))
    per_edge = 2 if with_perm else 1
    sizes = [num_src + 1 + per_edge * c.num_edges for c in chunks]
    buffer = torch.empty(sum(sizes), dtype=dtype,
                         device=chunks[0].src.device)
    offset = 0
    for chunk, size in zip(chunks, sizes):
        crow, col, perm = buffer[offset:offset + size].split(
            [num_src + 1, chunk.num_edges, (per_edge - 1) * chunk.num_edges])
        offset += size
        order = torch.argsort(chunk.src, stable=True)
        crow[0] = 0
        crow[1:] = torch.bincount(chunk.src, minlength=num_src).cumsum(0)
        col.copy_(chunk.dst[order] - chunk.row_start)
        if with_perm:
            perm.copy_(order)
        chunk._csr_t = (crow, col, perm if with_perm else None)


def index_dtype(largest: int) -> torch.dtype:
    """int32 for index tensors whose values (and lengths) fit in it."""
    return torch.int32 if largest < 2**31 - 1 else torch.long


class EdgeBlock:
    """All edges into this worker whose sources live on partition ``peer``,
    sorted by destination.

    ``num_src`` rows make up its source table: for the local block the whole
    local node set, for a remote block the rows ``DistGraph.recv_ids[peer]``
    fetched from the peer. ``src`` indexes that table, ``dst`` is the local
    destination and ``edge_pos`` the position in the graph's edge order.

    A halo slice (:meth:`sliced`) number ``s`` is the block of the edges
    whose sources are rows ``[s * rows, s * rows + num_src)`` of its
    parent's table; ``key`` tells the blocks of one propagation apart:
    ``(peer, slice)``.
    """

    def __init__(self, peer: int, num_src: int, src: Tensor, dst: Tensor,
                 edge_pos: Tensor, num_nodes: int,
                 chunk_size: Optional[int],
                 slice_index: Optional[int] = None) -> None:
        self.peer = peer
        self.num_src = num_src
        self.src, self.dst, self.edge_pos = src, dst, edge_pos
        self.num_nodes = num_nodes
        self.chunk_size = chunk_size
        self.slice_index = slice_index  # None: not a halo slice
        self._chunks: Dict[Tuple[Optional[int], Optional[int]],
                           List[EdgeChunk]] = {}
        self._slices: Dict[int, List['EdgeBlock']] = {}

    @property
    def key(self) -> Tuple[int, int]:
        return self.peer, self.slice_index or 0

    @property
    def num_edges(self) -> int:
        return int(self.src.numel())

    @property
    def chunks(self) -> List[EdgeChunk]:
        """Chunks of at most the graph's ``chunk_size`` edges."""
        return self.chunked(self.chunk_size)

    def chunked(self, max_edges: Optional[int],
                max_rows: Optional[int] = None) -> List[EdgeChunk]:
        """Chunks of at most ``max_edges`` edges whose destinations span at
        most ``max_rows`` rows (``None``: no limit); cached, so forward and
        backward see the same cut."""
        if max_rows is not None and (self.num_edges == 0 or int(
                self.dst[-1]) - int(self.dst[0]) < max_rows):
            max_rows = None  # the limit cannot bind: share the plain cut
        key = (max_edges, max_rows)
        if key not in self._chunks:
            self._chunks[key] = _make_chunks(
                self.src, self.dst, self.edge_pos, max_edges, self.num_nodes,
                cache_csr=self.slice_index is None, max_rows=max_rows)
        return self._chunks[key]

    def sliced(self, rows: Optional[int]) -> List['EdgeBlock']:
        """The block cut by source rows into ``ceil(num_src / rows)`` halo
        slices (``None``, or a table of at most ``rows`` rows: the block
        itself), each still sorted by destination; cached. A worker then
        holds one slice of a peer's rows at a time, not the whole table.
        A slice may have no edges (a view that dropped them); it is still
        exchanged, as the peer cannot know."""
        if rows is None or self.num_src <= rows:
            return [self]
        if rows not in self._slices:
            count = -(-self.num_src // rows)
            which = torch.div(self.src, rows, rounding_mode='floor')
            # A stable sort keeps each slice sorted by destination.
            order = torch.argsort(which, stable=True)
            sizes = torch.bincount(which, minlength=count).tolist()
            slices, start = [], 0
            for s, size in enumerate(sizes):
                sel = order[start:start + size]
                start += size
                slices.append(EdgeBlock(
                    self.peer, min(rows, self.num_src - s * rows),
                    self.src[sel] - s * rows, self.dst[sel],
                    self.edge_pos[sel], self.num_nodes, self.chunk_size,
                    slice_index=s))
            self._slices[rows] = slices
        return self._slices[rows]


def _make_chunks(src: Tensor, dst: Tensor, edge_pos: Tensor,
                 chunk_size: Optional[int], num_nodes: int,
                 cache_csr: bool = True,
                 max_rows: Optional[int] = None) -> List[EdgeChunk]:
    """Cuts destination-sorted edges into chunks of at most ``chunk_size``
    edges, each spanning at most ``max_rows`` destination rows (a chunk
    ends at whichever limit it reaches first)."""
    num_edges = src.numel()
    if max_rows is not None and num_edges > 0:
        bounds, lo = [0], 0
        while lo < num_edges:
            hi = num_edges if chunk_size is None else \
                min(lo + chunk_size, num_edges)
            # The first edge whose destination lies max_rows past lo's.
            limit = int(torch.searchsorted(
                dst, int(dst[lo]) + max_rows, side='left'))
            lo = min(hi, limit)
            bounds.append(lo)
    elif chunk_size is None or num_edges <= chunk_size:
        bounds = [0, num_edges]
    else:
        bounds = list(range(0, num_edges, chunk_size)) + [num_edges]
    chunks = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        d = dst[lo:hi]
        if hi > lo:
            row_start, row_end = int(d[0]), int(d[-1]) + 1
        else:
            row_start, row_end = 0, num_nodes
        chunks.append(EdgeChunk(src[lo:hi], d, edge_pos[lo:hi], row_start,
                                row_end, cache_csr))
    for chunk in chunks:
        chunk.family = chunks
    return chunks


# power_of_two_at_most: re-exported for the engine, which imports it from here.
__all__ = ['EdgeChunk', 'EdgeBlock', 'index_dtype', 'power_of_two_at_most']
