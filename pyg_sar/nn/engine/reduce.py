"""``sum`` / ``mean`` / ``max`` / ``min`` of PyG messages, exact across
blocks: max/min keep per-destination tie counts so the gradient is split
exactly as ``torch.scatter_reduce`` splits it."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar.graph.blocks import EdgeBlock, EdgeChunk
from pyg_sar.nn.engine.function import per_row
from pyg_sar.nn.engine.messages import MessageAggregator


class ReduceAggregator(MessageAggregator):
    """``sum`` / ``mean`` / ``max`` / ``min`` of the layer's messages, folded
    block by block into one node-sized result (and, for max / min, the
    number of messages equal to it)."""

    def begin(self) -> None:
        self.out = self.count = None

    def forward(self, block: EdgeBlock, tables: List[Tensor]) -> None:
        named = self.named(tables)
        for c_idx, chunk in enumerate(self.chunks(block)):
            outputs, made = self.compute(chunk, named, grad=self.keep)
            if self.out is None:
                self.out, self.count = self._init(outputs[0])
            if chunk.num_edges == 0:
                continue
            if self.keep:
                self.kept.append((block.key, chunk, c_idx, made, outputs,
                                  None))
            self._combine(outputs[0].detach(), chunk)

    def finish(self) -> Tensor:
        out, count = self.out, self.count
        if self.plan.aggr == 'mean':
            out = out / per_row(self.graph.in_degree.clamp(min=1), out)
        elif count is not None:
            out = torch.where(count > 0, out, torch.zeros_like(out))
        # max / min route gradients by the final value.
        self.out = out if count is not None else None
        return out

    def _init(self, msg: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
        shape = (self.graph.num_nodes, *msg.shape[1:])
        if self.plan.aggr in ('sum', 'mean'):
            return msg.new_zeros(shape), None
        fill = float('-inf') if self.plan.aggr == 'max' else float('inf')
        return msg.new_full(shape, fill), msg.new_zeros(shape)

    def _combine(self, msg: Tensor, chunk: EdgeChunk) -> None:
        out, count = self.out, self.count
        if count is None:
            out.index_add_(0, chunk.dst.long(), msg)  # int64: 3x faster
            return
        lo, hi = chunk.row_start, chunk.row_end
        idx = per_row(chunk.dst - lo, msg).long().expand_as(msg)
        reduce = 'amax' if self.plan.aggr == 'max' else 'amin'
        before = out[lo:hi]
        best = before.clone().scatter_reduce_(0, idx, msg, reduce,
                                              include_self=True)
        hits = (msg == best.gather(0, idx)).to(msg.dtype)
        chunk_count = torch.zeros_like(before).scatter_add_(0, idx, hits)
        count[lo:hi] = torch.where(best != before, chunk_count,
                                   count[lo:hi] + chunk_count)
        out[lo:hi] = best

    def output_grads(self, key, chunk: EdgeChunk, c_idx: int,
                     outputs: Tuple[Tensor, ...], heads, acc
                     ) -> Tuple[Tensor]:
        """d loss / d message. sum and mean (the output gradient already
        divided by the in-degree) pass it through; max and min route it
        evenly to every message equal to the final value, as
        ``scatter_reduce`` does."""
        msg = outputs[0]
        g_rows = self.grad_out.index_select(0, chunk.dst)
        if self.plan.aggr in ('sum', 'mean'):
            return (g_rows, )
        out = self.out.index_select(0, chunk.dst)
        count = self.count.index_select(0, chunk.dst)
        hit = (msg.detach() == out).to(msg.dtype)
        # PyG reduces into zeros with scatter_reduce(include_self=False),
        # whose backward still counts the zero it started from as a tie
        # when the result is exactly 0; matching it keeps gradients equal.
        return (g_rows * hit / (count + (out == 0).to(count.dtype)), )
