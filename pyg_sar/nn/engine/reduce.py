"""``sum`` / ``mean`` / ``max`` / ``min`` of PyG messages, exact across
blocks: max/min keep per-destination tie counts so the gradient is split
exactly as ``torch.scatter_reduce`` splits it."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from pyg_sar.graph.blocks import EdgeChunk


def _per_row(vector: Tensor, like: Tensor) -> Tensor:
    return vector.to(like.dtype).view(-1, *([1] * (like.dim() - 1)))


class ReduceMixin:
    """Owns the runner's reductions of general messages: their forward
    (``_forward_reduce``, ``_init_reduce``, ``_combine``) and the gradient
    of the aggregation with respect to each message (``_reduce_grad``)."""

    def _forward_reduce(self) -> Tensor:
        """sum / mean / max / min of general messages."""
        g = self.graph
        keep = self._keeps_graph()
        out = count = None
        kept = []
        for block, tables in self._blocks():
            named = self._named(tables)
            for c_idx, chunk in enumerate(self._chunks(block)):
                outputs, made = self._compute(chunk, named, grad=keep)
                if out is None:
                    out, count = self._init_reduce(outputs[0])
                if chunk.num_edges == 0:
                    continue
                if keep:
                    kept.append((block.key, chunk, c_idx, made, outputs,
                                 None))
                self._combine(out, count, outputs[0].detach(), chunk)
            # This block's rows go before the ring posts the next fetch.
            tables = named = outputs = made = None
        if self.plan.aggr == 'mean':
            out = out / _per_row(g.in_degree.clamp(min=1), out)
        elif count is not None:
            out = torch.where(count > 0, out, torch.zeros_like(out))
        self.state.update(out=out, count=count, kept=kept)
        return out

    def _init_reduce(self, msg: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
        shape = (self.graph.num_nodes, *msg.shape[1:])
        if self.plan.aggr in ('sum', 'mean'):
            return msg.new_zeros(shape), None
        fill = float('-inf') if self.plan.aggr == 'max' else float('inf')
        return msg.new_full(shape, fill), msg.new_zeros(shape)

    def _combine(self, out: Tensor, count: Optional[Tensor], msg: Tensor,
                 chunk: EdgeChunk) -> None:
        if count is None:
            out.index_add_(0, chunk.dst.long(), msg)  # int64: 3x faster
            return
        lo, hi = chunk.row_start, chunk.row_end
        idx = _per_row(chunk.dst - lo, msg).long().expand_as(msg)
        reduce = 'amax' if self.plan.aggr == 'max' else 'amin'
        before = out[lo:hi]
        best = before.clone().scatter_reduce_(0, idx, msg, reduce,
                                              include_self=True)
        hits = (msg == best.gather(0, idx)).to(msg.dtype)
        chunk_count = torch.zeros_like(before).scatter_add_(0, idx, hits)
        count[lo:hi] = torch.where(best != before, chunk_count,
                                   count[lo:hi] + chunk_count)
        out[lo:hi] = best

    def _reduce_grad(self, chunk: EdgeChunk, msg: Tensor,
                     grad_out: Tensor) -> Tensor:
        """d loss / d message. sum and mean (``grad_out`` already divided by
        the in-degree) pass it through; max and min route it evenly to every
        message equal to the final value, as ``scatter_reduce`` does."""
        g_rows = grad_out.index_select(0, chunk.dst)
        if self.plan.aggr in ('sum', 'mean'):
            return g_rows
        out = self.state['out'].index_select(0, chunk.dst)
        count = self.state['count'].index_select(0, chunk.dst)
        hit = (msg.detach() == out).to(msg.dtype)
        # PyG reduces into zeros with scatter_reduce(include_self=False),
        # whose backward still counts the zero it started from as a tie
        # when the result is exactly 0; matching it keeps gradients equal.
        return g_rows * hit / (count + (out == 0).to(count.dtype))
