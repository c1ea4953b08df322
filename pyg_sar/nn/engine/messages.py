"""Aggregations of messages the layer computes per edge: evaluating
``message`` (and ``edge_score``) on one chunk, and the backward they share.

:class:`MessageAggregator` gathers a chunk's keyword arguments, evaluates
the layer on them with or without autograd, and in backward recomputes (or,
in ``"sa"``, reuses) each chunk's messages and backpropagates the analytic
gradient of the aggregation through them. Its subclasses say what that
gradient is: :class:`~.reduce.ReduceAggregator` (sum / mean / max / min)
and :class:`~.attention.AttentionAggregator` (online softmax).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar.graph.blocks import EdgeBlock, EdgeChunk
from pyg_sar.graph.transport import index_add_rows
from pyg_sar.nn.engine.function import Aggregator, Inputs, per_row, \
    widest_row
from pyg_sar.nn.engine.spec import Plan

# Gathered rows, messages and their gradients coexist in backward.
LIVE_COPIES = 4


class MessageAggregator(Aggregator):
    """The part of an aggregation of per-edge messages that does not depend
    on how they are combined: argument gathering, message evaluation, and
    the backward through recomputed (``sar``, ``one_shot``) or kept
    (``sa``) messages. A ``'linear'`` plan (a message linear in ``x_j``
    with fixed coefficients) evaluates its gradient at zero rows: nothing
    re-fetched, nothing kept."""

    def __init__(self, plan: Plan, inputs: Inputs) -> None:
        self.linear = plan.kind == 'linear'
        # A non-linear message's backward reads its source rows again
        # (none runs when no input needs a gradient: no_grad, inference).
        self.needs_tables = not self.linear and any(inputs.needs_grad)
        super().__init__(plan, inputs)
        self.keep = self.mode == 'sa' and not self.linear and \
            any(inputs.needs_grad)
        self.kept: List[tuple] = []

    def edge_cost(self) -> Tuple[int, int]:
        widest = widest_row(self.inputs.tensors)
        return LIVE_COPIES * widest, widest

    # Evaluating the layer on a chunk #########################################

    def named(self, tables: List[Tensor]) -> Dict[str, Tensor]:
        return dict(zip(self.inputs.src_names, tables))

    def _wants_grad(self, key: Tuple[str, Any]) -> bool:
        kind, ref = key
        slot = self.plan.src_slots[ref] if kind == 'src' else ref
        return self.inputs.needs_grad[slot]

    def chunk_args(self, method: str, chunk: EdgeChunk,
                   tables: Dict[str, Tensor], made: Optional[Dict]
                   ) -> Dict[str, Any]:
        """The keyword arguments of ``method`` for one chunk. With ``made``
        (a dict, shared by the calls of one chunk), the gathered rows that
        need a gradient become autograd leaves recorded there as
        ``key -> (leaf, index)``: their gradients are scattered back with
        ``index``, so no full-size table gradient is built per chunk."""
        plan, tensors = self.plan, self.inputs.tensors
        args = {}
        for name in plan.sig.params[method]:
            base = name[:-2]
            if name.endswith('_j') and base in tables:
                key, table, index = ('src', base), tables[base], chunk.src
            elif name.endswith('_i') and base in plan.dst_slots:
                slot = plan.dst_slots[base]
                key, table, index = ('dst', slot), tensors[slot], chunk.dst
            elif name in plan.edge_slots:
                slot = plan.edge_slots[name]
                key, table, index = (('edge', slot), tensors[slot],
                                     chunk.edge_pos)
            else:
                # index/ptr/size_i never reach the engine: such layers run
                # over whole neighborhoods (DistMessagePassing.propagate).
                if name in plan.constants:
                    args[name] = plan.constants[name]
                continue
            if made is not None and key in made:
                args[name] = made[key][0]
                continue
            rows = table.index_select(0, index)
            if made is not None and self._wants_grad(key):
                rows.requires_grad_()
                made[key] = (rows, index)
            args[name] = rows
        return args

    def compute(self, chunk: EdgeChunk, tables: Dict[str, Tensor],
                grad: bool) -> Tuple[Tuple[Tensor, ...], Optional[Dict]]:
        """The chunk's messages (or ``(scores, values)`` for attention), and
        the gathered leaves they were computed from when ``grad``."""
        module = self.plan.module
        made: Optional[Dict] = {} if grad else None
        with torch.set_grad_enabled(grad):
            if self.plan.kind == 'attention':
                outputs = (module.edge_score(**self.chunk_args(
                    'edge_score', chunk, tables, made)), )
                if self.plan.value_source is None:
                    outputs += (module.message(**self.chunk_args(
                        'message', chunk, tables, made)), )
            else:
                outputs = (module.message(**self.chunk_args(
                    'message', chunk, tables, made)), )
        return outputs, made

    # What subclasses define ##################################################

    def block_heads(self, tables: Dict[str, Tensor]) -> Optional[Tensor]:
        """Per-block data of the backward (the attention value table,
        head-major); ``None`` by default."""
        return None

    def output_grads(self, key: Tuple[int, int], chunk: EdgeChunk,
                     c_idx: int, outputs: Tuple[Tensor, ...],
                     heads: Optional[Tensor], acc: List[Tensor]
                     ) -> Tuple[Tensor, ...]:
        """The gradient of the loss with respect to each of the chunk's
        ``outputs`` (:meth:`compute`)."""
        raise NotImplementedError

    # Backward ################################################################

    def begin_backward(self, grad_out: Tensor) -> None:
        if self.plan.aggr == 'mean':
            grad_out = grad_out / per_row(
                self.graph.in_degree.clamp(min=1), grad_out)
        self.grad_out = grad_out
        self.kept_by_block: Dict[tuple, list] = {}
        for key, *item in self.kept:
            self.kept_by_block.setdefault(key, []).append(item)
        self.kept = []
        self.grad_params = ([] if self.linear else
                            [p for p in self.inputs.params.values()
                             if p.requires_grad])
        self.param_grads: Dict[int, Tensor] = {}
        # Gradients of destination and edge tensors, summed over chunks.
        self.local_grads: Dict[int, Tensor] = {}

    def backward(self, block: EdgeBlock, tables: Optional[List[Tensor]]
                 ) -> List[Tensor]:
        transport = self.transport
        acc = [transport.zeros(block.num_src, k)
               for k in range(len(self.inputs.source_meta))]
        if self.keep:
            for chunk, c_idx, made, outputs, heads in \
                    self.kept_by_block.pop(block.key, []):
                self._chunk_grads(block.key, chunk, c_idx, None, made,
                                  outputs, acc, heads)
            return acc
        if self.linear:
            # The VJP of a linear message does not depend on the source
            # rows: evaluate it at zero, nothing re-fetched.
            tables = [torch.zeros_like(a) for a in acc]
        named = self.named(tables)
        heads = self.block_heads(named)
        for c_idx, chunk in enumerate(self.chunks(block)):
            if chunk.num_edges > 0:
                self._chunk_grads(block.key, chunk, c_idx, named, None, None,
                                  acc, heads)
        return acc

    def _chunk_grads(self, key, chunk: EdgeChunk, c_idx: int, tables,
                     made, outputs, acc: List[Tensor],
                     heads: Optional[Tensor]) -> None:
        """Backpropagates the aggregation's gradient through one chunk's
        messages (recomputed when ``outputs`` is ``None``): source rows into
        ``acc``, destination and edge rows and parameters into the
        propagation's sums."""
        if outputs is None:
            outputs, made = self.compute(chunk, tables, grad=True)
        with torch.no_grad():
            grad_outputs = self.output_grads(key, chunk, c_idx, outputs,
                                             heads, acc)
        keys = list(made)
        params = self.grad_params
        targets = [made[k][0] for k in keys] + params
        # Outputs that depend on nothing differentiable (raw features into
        # a message that reads no parameter) have no gradient.
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs)
                 if o.requires_grad]
        if not targets or not pairs:
            return
        res = torch.autograd.grad([o for o, _ in pairs], targets,
                                  [g for _, g in pairs], allow_unused=True)
        src_names = self.inputs.src_names
        for k, value in zip(keys, res):
            if value is None:
                continue
            kind, ref = k
            # int64 (block indices may be int32): index_add_ on CPU is 3x
            # slower with an int32 index.
            index = made[k][1].long()
            if kind == 'src':
                index_add_rows(acc[src_names.index(ref)], index, value)
            else:
                if ref not in self.local_grads:
                    self.local_grads[ref] = torch.zeros_like(
                        self.inputs.tensors[ref])
                self.local_grads[ref].index_add_(0, index, value)
        for p, value in zip(params, res[len(keys):]):
            if value is not None:
                k = id(p)
                self.param_grads[k] = value if k not in self.param_grads \
                    else self.param_grads[k] + value

    def end_backward(self) -> None:
        inputs = self.inputs
        for slot, value in self.local_grads.items():
            inputs.add_grad(slot, value)
        for slot, p in inputs.params.items():
            if id(p) in self.param_grads:
                inputs.add_grad(slot, self.param_grads[id(p)])
