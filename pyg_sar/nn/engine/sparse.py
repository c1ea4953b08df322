"""The linear fast path for messages ``w_e * x_j``: sparse matrix products
both ways, so neither forward nor backward materializes ``[E, F]`` messages
and the backward sends ``A^T g`` without re-fetching anything
(:class:`SparseAggregator`), and the CSR product helpers the attention
value path shares."""
from __future__ import annotations

import math
import warnings
from typing import List, Optional

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.graph.blocks import EdgeBlock, EdgeChunk, power_of_two_at_most
from pyg_sar.nn.engine.function import Aggregator, per_row


def sparse_csr(crow: Tensor, col: Tensor, values: Tensor, shape) -> Tensor:
    """``torch.sparse_csr_tensor`` without its beta notice: CSR products
    are the point of the linear path, and the notice says nothing to a user
    of this package. Silenced here only, not for the process."""
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', '.*Sparse CSR tensor support is '
                                'in beta.*')
        warnings.filterwarnings('ignore', '.*Sparse invariant checks are '
                                'implicitly.*')
        return torch.sparse_csr_tensor(crow, col, values, shape)


def sparse_kernels_fit(num_entries: int, shape) -> bool:
    """Whether torch's sparse kernels (cuSPARSE, ``sampled_addmm``) accept
    a pattern: they refuse one with more entries than the matrix has cells,
    which duplicate edges give a small chunk."""
    return num_entries <= shape[0] * shape[1]


def csr_matmul(crow: Tensor, col: Tensor, values: Tensor, shape,
               dense: Tensor) -> Tensor:
    """``(CSR matrix) @ dense``. A pattern with more entries than the matrix
    has cells (duplicate edges in a small chunk) is refused by cuSPARSE and
    some CPU kernels; such chunks are tiny, and are summed by ``index_add``
    instead."""
    if sparse_kernels_fit(col.numel(), shape):
        return sparse_csr(crow, col, values, shape) @ dense
    rows = shape[0]
    row = torch.repeat_interleave(torch.arange(rows, device=col.device),
                                  (crow[1:] - crow[:-1]).long(),
                                  output_size=col.numel())
    out = dense.new_zeros((rows, *dense.shape[1:]))
    return out.index_add_(0, row, values.unsqueeze(-1) *
                          dense.index_select(0, col))


def csr_into(out: Tensor, crow: Tensor, col: Tensor, values: Tensor, shape,
             dense: Tensor, accumulate: bool = True) -> None:
    """``out (+)= (CSR matrix) @ dense``, in place where the kernels allow
    (:func:`_spmm_into`), through :func:`csr_matmul`'s fallback where the
    pattern has more entries than cells."""
    if sparse_kernels_fit(col.numel(), shape):
        _spmm_into(out, sparse_csr(crow, col, values, shape),
                   dense, accumulate)
    elif accumulate:
        out += csr_matmul(crow, col, values, shape, dense)
    else:
        out.copy_(csr_matmul(crow, col, values, shape, dense))


class SparseAggregator(Aggregator):
    """Sum or mean of linear messages ``w_e * x_j`` with fixed weights
    (``message_weight``): one sparse product per chunk in forward, and
    ``A^T g`` per block in backward, which needs no source rows (nothing
    re-fetched) and sends exactly the forward's bytes back. An ``add_to``
    input (``plan.init_slot``) is the output buffer: the aggregate is added
    into its memory."""

    def slice_rows(self) -> Optional[int]:
        """Rows per halo slice: a power of two (layers of similar widths
        then share one cut of the blocks) whose rows of every source tensor
        fit ``halo_slice_bytes``; ``None`` when slicing is off. Every rank
        derives the same value from the same model. (Sparse products add
        each slice into the output in place; the per-edge kinds would
        rebuild destination-sized temporaries per slice, so only this kind
        slices.)"""
        budget = comm.config().halo_slice_bytes
        if not budget:
            return None
        row_bytes = sum(math.prod(shape) * dtype.itemsize
                        for shape, dtype, _ in self.inputs.source_meta)
        return power_of_two_at_most(max(1, budget // max(row_bytes, 1)))

    def _values(self, chunk: EdgeChunk, like: Tensor,
                perm: Optional[Tensor] = None) -> Tensor:
        """The chunk's edge weights (ones without ``message_weight``), in
        CSR order of the transposed chunk with ``perm``."""
        weight = self.plan.linear_weight
        if weight is None:
            return like.new_ones(chunk.num_edges)
        values = weight.index_select(0, chunk.edge_pos).to(like.dtype)
        return values if perm is None else values[perm]

    def begin(self) -> None:
        g, init = self.graph, self.plan.init_slot
        self.out = None if init is None else self.inputs.tensors[init]
        # Into a running sum (add_to): mean's 1 / in-degree goes into the
        # edge values, as the sum already there must not be divided.
        self.inv_deg = (1.0 / g.in_degree.clamp(min=1)
                        if init is not None and self.plan.aggr == 'mean'
                        else None)

    def forward(self, block: EdgeBlock, tables: List[Tensor]) -> None:
        x = tables[0]
        if self.out is None:
            self.out = x.new_zeros((self.graph.num_nodes, *x.shape[1:]))
        out, inv_deg = self.out, self.inv_deg
        weighted = self.plan.linear_weight is not None
        flat = x.flatten(1) if x.dim() > 1 else x.view(-1, 1)
        for chunk in self.chunks(block):
            if chunk.num_edges == 0:
                continue
            if self.inputs.any_src_grad:
                # Build (once) the transposed CSR the backward reuses now,
                # while few activations are alive, not at the backward's
                # peak.
                chunk.csr_transposed(block.num_src, weighted)
            crow, col = chunk.csr()
            values = self._values(chunk, x)
            if inv_deg is not None:
                values = values * inv_deg.to(values.dtype)[chunk.dst]
            rows = chunk.row_end - chunk.row_start
            csr_into(out[chunk.row_start:chunk.row_end].view(rows, -1),
                     crow, col, values, (rows, block.num_src), flat)

    def finish(self) -> Tensor:
        out = self.out
        if self.plan.aggr == 'mean' and self.inv_deg is None:
            out.div_(per_row(self.graph.in_degree.clamp(min=1), out))
        self.out = None
        # A linear backward needs no input values: let them go.
        self.inputs.use(None)
        return out

    def begin_backward(self, grad_out: Tensor) -> None:
        self.flat_g = (grad_out.flatten(1) if grad_out.dim() > 1
                       else grad_out.view(-1, 1))
        # mean: A^T (g / deg) with 1 / deg folded into the edge values, so
        # no scaled copy of the node-sized gradient is made.
        self.inv_deg = (1.0 / self.graph.in_degree.clamp(min=1).to(
            self.flat_g.dtype) if self.plan.aggr == 'mean' else None)

    def backward(self, block: EdgeBlock, tables) -> List[Tensor]:
        flat_g, inv_deg = self.flat_g, self.inv_deg
        weighted = self.plan.linear_weight is not None
        acc = None  # the first chunk's product, not zeros plus it
        for chunk in self.chunks(block):
            if chunk.num_edges == 0:
                continue
            crow, col, perm = chunk.csr_transposed(block.num_src, weighted)
            values = self._values(chunk, flat_g, perm)
            if inv_deg is not None:
                values = values * inv_deg[chunk.row_start:chunk.row_end][col]
            rows = flat_g[chunk.row_start:chunk.row_end]
            shape = (block.num_src, chunk.row_end - chunk.row_start)
            if acc is None:
                acc = comm.buffers.empty((block.num_src, flat_g.shape[1]),
                                         flat_g.dtype, flat_g.device)
                csr_into(acc, crow, col, values, shape, rows,
                         accumulate=False)
            else:
                csr_into(acc, crow, col, values, shape, rows)
        if acc is None:
            acc = flat_g.new_zeros((block.num_src, flat_g.shape[1]))
        return [acc.view(block.num_src, *self.inputs.source_meta[0][0])]


def _spmm_into(out: Tensor, adj: Tensor, dense: Tensor,
               accumulate: bool = True) -> None:
    """``out (+)= adj @ dense`` written into ``out`` (a contiguous row
    range). ``adj @ dense`` on CPU CSR builds its result in a temporary of
    the output's size and copies it, twice the output at the peak; addmm
    with ``out=`` writes in place, with the same values."""
    if out.is_contiguous():
        torch.addmm(out, adj, dense, beta=1.0 if accumulate else 0.0,
                    out=out)
    elif accumulate:
        out += adj @ dense
    else:
        out.copy_(adj @ dense)
