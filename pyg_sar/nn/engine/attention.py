"""Attention: a softmax over all in-edges of a destination, computed online
(running max and sum per destination and head, rescaled as blocks arrive),
with replayable dropout, and its FlashAttention-style backward. Values that
are plain source rows are aggregated with one sparse product per head."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.graph.blocks import EdgeBlock, EdgeChunk, power_of_two_at_most
from pyg_sar.nn.engine.function import widest_row
from pyg_sar.nn.engine.messages import LIVE_COPIES, MessageAggregator
from pyg_sar.nn.engine.sparse import (csr_into, csr_matmul, sparse_csr,
                                       sparse_kernels_fit)

# PyG's softmax adds this to the normalizer; matching it keeps outputs equal.
_SOFTMAX_EPS = 1e-16


class AttentionAggregator(MessageAggregator):
    """Softmax-weighted sum over all in-edges of each destination and head,
    computed online: running max and sum per destination and head, rescaled
    as blocks arrive. With ``plan.value_source`` the values are the rows of
    a source table (``message_is_identity``), aggregated with one sparse
    product per head and never gathered per edge."""

    def heads_first(self) -> List[bool]:
        # The value table is fetched, and its gradient built and sent,
        # head-major: its per-head products read and write it so.
        return [name == self.plan.value_source
                for name in self.inputs.src_names]

    def edge_cost(self) -> Tuple[int, int]:
        plan, inputs = self.plan, self.inputs
        if plan.value_source is None:
            return super().edge_cost()
        # Only the score's inputs are gathered per edge (scores,
        # probabilities, masks and their gradients: twice as many); values
        # appear per destination row.
        gathered = [inputs.tensors[s] for s in inputs.slots_read(
            'edge_score')]
        widest = widest_row([inputs.tensors[plan.src_slots[
            plan.value_source]]])
        rows_per_edge = self.graph.num_nodes / max(self.graph.num_edges, 1)
        per_edge = int(2 * LIVE_COPIES * widest_row(gathered) +
                       LIVE_COPIES * widest * rows_per_edge) + 1
        return per_edge, widest

    def row_limit(self) -> Optional[int]:
        """Destination rows per chunk on the sparse value path. Its
        per-head products build ``[rows, channels]`` results; a block with
        few edges per destination (a peer's block) would otherwise be one
        chunk over all of the worker's rows, whose per-head results are
        node-sized: mapped, faulted in and unmapped once per head. At most
        ``edge budget / 2 KiB`` rows, the same for every layer, so layers
        share one cut; a worker's own block, with many edges per row,
        reaches its edge limit first and is cut as before."""
        if self.plan.value_source is None:
            return None
        return power_of_two_at_most(
            max(16, comm.config().budget_for(self.inputs.device()) // 2048))

    def begin(self) -> None:
        self.run_max = self.run_sum = self.out = None

    def forward(self, block: EdgeBlock, tables: List[Tensor]) -> None:
        named = self.named(tables)
        heads = self.block_heads(named)
        num_nodes = self.graph.num_nodes
        for c_idx, chunk in enumerate(self.chunks(block)):
            outputs, made = self.compute(chunk, named, grad=self.keep)
            score = outputs[0]
            value = outputs[1] if heads is None else None
            if self.out is None:
                self.run_max = score.new_full((num_nodes, *score.shape[1:]),
                                              float('-inf'))
                self.run_sum = torch.zeros_like(self.run_max)
                width = (value.shape[1:] if heads is None else
                         (heads.shape[0], heads.shape[2]))
                self.out = score.new_zeros((num_nodes, *width))
            if chunk.num_edges == 0:
                continue
            if self.keep:
                self.kept.append((block.key, chunk, c_idx, made, outputs,
                                  heads))
            run_max, run_sum = self.run_max, self.run_sum
            score = score.detach()
            lo, hi = chunk.row_start, chunk.row_end
            # int64: scatter needs it, and index_add_ runs 3x faster
            rows = (chunk.dst - lo).long()
            idx = rows.view(-1, 1).expand_as(score)
            old_max = run_max[lo:hi]
            new_max = old_max.clone().scatter_reduce_(
                0, idx, score, 'amax', include_self=True)
            scale = torch.where(new_max == float('-inf'),
                                torch.zeros_like(new_max),
                                torch.exp(old_max - new_max))
            weight = (score - new_max.gather(0, idx)).exp_()
            run_sum[lo:hi] = run_sum[lo:hi] * scale + torch.zeros_like(
                old_max).scatter_add_(0, idx, weight)
            mask = self._dropout_mask(block.key, c_idx, weight)
            if not isinstance(mask, float):  # (1.0 without dropout)
                weight = weight * mask
            part = self.out[lo:hi]  # a view: updated in place
            part.mul_(scale.unsqueeze(-1))
            if heads is None:
                part.index_add_(0, rows,
                                weight.unsqueeze(-1) * value.detach())
            else:
                self._add_per_head_spmm(part, chunk, weight, heads)
            run_max[lo:hi] = new_max

    def finish(self) -> Tensor:
        self.out.div_((self.run_sum + _SOFTMAX_EPS).unsqueeze(-1))
        return self.out

    def begin_backward(self, grad_out: Tensor) -> None:
        super().begin_backward(grad_out)
        # The output is needed for D = dO . out only: let it go before the
        # ring (the one backward is its last use).
        self.delta = (grad_out * self.out).sum(-1)
        self.out = None

    def block_heads(self, tables: Dict[str, Tensor]) -> Optional[Tensor]:
        return self._value_heads(tables)

    def output_grads(self, key, chunk: EdgeChunk, c_idx: int,
                     outputs: Tuple[Tensor, ...], heads: Optional[Tensor],
                     acc: List[Tensor]) -> Tuple[Tensor, ...]:
        if heads is None:
            return self._attention_grads(key, chunk, c_idx, outputs,
                                         self.grad_out, self.delta)
        k = self.inputs.src_names.index(self.plan.value_source)
        return self._sparse_attention_grads(
            key, chunk, c_idx, outputs[0], self.grad_out, self.delta, heads,
            acc[k] if self.inputs.any_src_grad else None)

    def _value_heads(self, tables: Dict[str, Tensor]) -> Optional[Tensor]:
        """The value rows head-major, ``[H, num_src, C]``, on the sparse
        value path (one contiguous copy per block, a view in ``"sa"``)."""
        if self.plan.value_source is None:
            return None
        heads = tables[self.plan.value_source].transpose(0, 1)
        # One head-major copy per block (not in "sa", which keeps it per
        # chunk): every per-head product of every chunk would otherwise copy
        # its strided [num_src, C] operand again.
        return heads if self.mode == 'sa' else heads.contiguous()

    @staticmethod
    def _add_per_head_spmm(part: Tensor, chunk: EdgeChunk, weight: Tensor,
                           heads: Tensor) -> None:
        """Adds ``sum_j weight[e, h] * value[j, h]`` to each destination row
        of the chunk: one CSR product per head, no per-edge value rows."""
        crow, col = chunk.csr()
        shape = (chunk.row_end - chunk.row_start, heads.shape[1])
        for h in range(heads.shape[0]):
            part[:, h] += csr_matmul(crow, col, weight[:, h].contiguous(),
                                     shape, heads[h])

    def _dropout_mask(self, key: Tuple[int, int], c_idx: int, like: Tensor):
        """Attention dropout, replayable: the mask of a chunk depends only on
        the call's seed and the chunk's position (block ``key`` and chunk
        index)."""
        p = self.plan.dropout
        if p <= 0:
            return 1.0
        gen = torch.Generator(device=like.device)
        peer, piece = key
        gen.manual_seed((self.plan.seed * 1000003 + peer * 7919 +
                         piece * 104729 + c_idx) % (2**62))
        keep = torch.rand(like.shape, generator=gen, device=like.device,
                          dtype=like.dtype) >= p
        return keep.to(like.dtype) / (1.0 - p)

    def _probabilities(self, key: Tuple[int, int], chunk: EdgeChunk,
                       c_idx: int,
                       score: Tensor):
        """The chunk's softmax probabilities, recomputed from the saved
        per-destination max and sum, and its replayed dropout mask."""
        # In place: one [E, H] temporary besides the result.
        prob = score.detach() - self.run_max.index_select(
            0, chunk.dst)
        prob.exp_().div_(self.run_sum.index_select(
            0, chunk.dst).add_(_SOFTMAX_EPS))
        return prob, self._dropout_mask(key, c_idx, prob)

    def _sparse_attention_grads(self, key: Tuple[int, int], chunk: EdgeChunk,
                                c_idx: int, score: Tensor, grad_out: Tensor,
                                delta: Tensor, heads: Tensor,
                                value_grad: Optional[Tensor]):
        """:meth:`_attention_grads` for values that are source rows: the
        value gradient ``A_h^T (p z) dO_h`` and the per-edge products
        ``dO_i . v_j`` (sampled dense-dense products) are taken per head on
        the chunk's sparsity pattern; only ``[E, H]`` tensors are built.
        ``value_grad`` is a row-major view of head-major memory
        (:meth:`Transport.zeros`)."""
        prob, mask = self._probabilities(key, chunk, c_idx, score)
        # (no copy without dropout: the mask is then 1.0)
        weighted = prob if isinstance(mask, float) else prob * mask
        num_src = heads.shape[1]
        lo, hi = chunk.row_start, chunk.row_end
        g_heads = grad_out[lo:hi].transpose(0, 1)  # head-major view
        crow, col = chunk.csr()
        crow_t, col_t, perm = chunk.csr_transposed(num_src)
        dot = torch.empty_like(prob)
        # sampled_addmm fails on patterns with more entries than the dense
        # block has cells (duplicate edges in a small chunk): gather those
        # per edge instead.
        dense_ok = sparse_kernels_fit(chunk.num_edges, (hi - lo, num_src))
        if dense_ok:
            pattern = sparse_csr(crow, col, score.new_zeros(chunk.num_edges),
                                 (hi - lo, num_src))
        for h in range(heads.shape[0]):
            if dense_ok:
                dot[:, h] = torch.sparse.sampled_addmm(
                    pattern, g_heads[h], heads[h].t(), beta=0.0).values()
            else:
                dot[:, h] = (g_heads[h].index_select(0, chunk.dst - lo) *
                             heads[h].index_select(0, chunk.src)).sum(-1)
            if value_grad is not None:
                # Added in place into the head-major gradient (a contiguous
                # [num_src, C] per head): no per-chunk buffer, no pass over
                # the whole table per chunk and head.
                csr_into(value_grad.transpose(0, 1)[h], crow_t, col_t,
                         weighted[perm, h].contiguous(), (num_src, hi - lo),
                         g_heads[h])
        del weighted
        # p (z dO.v - D), in place in dot
        if not isinstance(mask, float):
            dot.mul_(mask)
        return (dot.sub_(delta.index_select(0, chunk.dst)).mul_(prob), )

    def _attention_grads(self, key: Tuple[int, int], chunk: EdgeChunk,
                         c_idx: int,
                         outputs, grad_out: Tensor, delta: Tensor):
        """FlashAttention-style gradients of one chunk from the saved
        per-destination max and sum: ``dv = p z dO`` and
        ``da = p (z dO.v - D)`` with ``D = dO.out`` and dropout mask ``z``."""
        score, value = outputs
        prob, mask = self._probabilities(key, chunk, c_idx, score)
        g_rows = grad_out.index_select(0, chunk.dst)
        grad_value = (prob * mask).unsqueeze(-1) * g_rows
        dot = (g_rows * value.detach()).sum(-1)
        grad_score = prob * (mask * dot - delta.index_select(0, chunk.dst))
        return grad_score, grad_value
