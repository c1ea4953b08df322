"""Edge blocks of a :class:`~pyg_sar.DistGraph`: the in-edges of one
worker from one source partition (:class:`EdgeBlock`), cut into runs of
destination-sorted edges (:class:`EdgeChunk`) that the SAR engine aggregates
in turn, with the CSR layouts of its sparse products cached per chunk."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor


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
    _csr: Optional[Tuple[Tensor, Tensor]] = None
    _csr_t: Optional[Tuple[Tensor, Tensor, Tensor]] = None

    @property
    def num_edges(self) -> int:
        return int(self.src.numel())

    def csr(self) -> Tuple[Tensor, Tensor]:
        """``(crow, col)`` of the chunk's rows (destinations) over the block's
        source table; values are in edge order."""
        if self._csr is None:
            rows = self.dst - self.row_start
            crow = torch.zeros(self.row_end - self.row_start + 1,
                               dtype=torch.long, device=self.dst.device)
            crow[1:] = torch.bincount(
                rows, minlength=self.row_end - self.row_start).cumsum(0)
            self._csr = (crow, self.src)
        return self._csr

    def csr_transposed(self, num_src: int) -> Tuple[Tensor, Tensor, Tensor]:
        """``(crow, col, perm)`` of the transposed chunk: rows are sources,
        columns destination rows; ``perm`` orders edge values accordingly.
        Kept for the backward of every epoch, so stored as int32 where the
        edge and row counts fit (8 bytes per edge instead of 16)."""
        if self._csr_t is None:
            dtype = _index_dtype(max(self.num_edges, num_src,
                                     self.row_end - self.row_start))
            perm = torch.argsort(self.src, stable=True)
            crow = torch.zeros(num_src + 1, dtype=dtype,
                               device=self.src.device)
            crow[1:] = torch.bincount(self.src, minlength=num_src).cumsum(0)
            col = (self.dst[perm] - self.row_start).to(dtype)
            self._csr_t = (crow, col, perm.to(dtype))
        return self._csr_t


def _index_dtype(largest: int) -> torch.dtype:
    """int32 for index tensors whose values (and lengths) fit in it."""
    return torch.int32 if largest < 2**31 - 1 else torch.long


class EdgeBlock:
    """All edges into this worker whose sources live on partition ``peer``,
    sorted by destination.

    ``num_src`` rows make up its source table: for the local block the whole
    local node set, for a remote block the rows ``DistGraph.recv_ids[peer]``
    fetched from the peer. ``src`` indexes that table, ``dst`` is the local
    destination and ``edge_pos`` the position in the graph's edge order.
    """

    def __init__(self, peer: int, num_src: int, src: Tensor, dst: Tensor,
                 edge_pos: Tensor, num_nodes: int,
                 chunk_size: Optional[int]) -> None:
        self.peer = peer
        self.num_src = num_src
        self.src, self.dst, self.edge_pos = src, dst, edge_pos
        self.num_nodes = num_nodes
        self.chunk_size = chunk_size
        self._chunks: Dict[Optional[int], List[EdgeChunk]] = {}

    @property
    def num_edges(self) -> int:
        return int(self.src.numel())

    @property
    def chunks(self) -> List[EdgeChunk]:
        """Chunks of at most the graph's ``chunk_size`` edges."""
        return self.chunked(self.chunk_size)

    def chunked(self, max_edges: Optional[int]) -> List[EdgeChunk]:
        """Chunks of at most ``max_edges`` edges (``None``: one chunk);
        cached, so forward and backward see the same cut."""
        if max_edges not in self._chunks:
            self._chunks[max_edges] = _make_chunks(
                self.src, self.dst, self.edge_pos, max_edges, self.num_nodes)
        return self._chunks[max_edges]


def _make_chunks(src: Tensor, dst: Tensor, edge_pos: Tensor,
                 chunk_size: Optional[int],
                 num_nodes: int) -> List[EdgeChunk]:
    """Cuts destination-sorted edges into chunks of at most ``chunk_size``."""
    num_edges = src.numel()
    if chunk_size is None or num_edges <= chunk_size:
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
                                row_end))
    return chunks
