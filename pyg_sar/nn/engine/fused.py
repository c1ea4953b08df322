"""Attention with fused kernels: the online softmax of
:class:`~.attention.AttentionAggregator`, one kernel call per chunk and
pass (:mod:`.kernels`), for layers whose score is GAT's, GATv2's or
TransformerConv's dot product (``fused_score()``). The per-edge scores,
probabilities and gathered rows never exist as separate tensors: the
forward keeps only the running max, sum and output per row and head, and
the backward recomputes the probabilities chunk by chunk. Per chunk, only
``[E, H]`` weights (and the per-channel edge gradient of GATv2 and the dot
product, when they have edge terms) are built.

:func:`aggregator_for` picks it, or the separate-operator
:class:`~.attention.AttentionAggregator` (the reference), and says once in
the log which one a layer runs and why."""
from __future__ import annotations

import logging
import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar.graph.blocks import EdgeBlock, EdgeChunk
from pyg_sar.nn.engine import kernels
from pyg_sar.nn.engine.attention import AttentionAggregator
from pyg_sar.nn.engine.function import Inputs
from pyg_sar.nn.engine.spec import FusedScore, Plan

log = logging.getLogger('pyg_sar')
_SAID: set = set()


def _defining_class(cls: type, name: str) -> Optional[type]:
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def fused_spec(plan: Plan, tensors) -> Tuple[Optional[FusedScore], str]:
    """The layer's :class:`FusedScore` when the fused kernels compute this
    propagation exactly, else ``None`` and why not."""
    module, cls = plan.module, type(plan.module)
    owner = _defining_class(cls, 'fused_score')
    if owner is None:
        return None, 'the layer declares no fused_score'
    if _defining_class(cls, 'edge_score') is not owner or \
            _defining_class(cls, 'message') is not owner or \
            _defining_class(cls, 'fused_edge_term') is not owner:
        # A subclass that changed the score or the message: its own code
        # runs, not the kernels of its parent's formula.
        return None, 'edge_score/message overridden below fused_score'
    spec = module.fused_score()
    if spec is None:
        return None, 'not fusable as configured'
    if plan.value_source is None:
        return None, 'the message is not the source rows'
    if plan.graph.mode == 'sa':
        return None, 'mode "sa" keeps per-chunk autograd graphs'
    if spec.score not in plan.src_slots or \
            spec.dst not in plan.dst_slots or \
            set(plan.src_slots) - {spec.score, plan.value_source} or \
            set(plan.dst_slots) != {spec.dst}:
        return None, 'edge_score reads other node arguments'
    if set(plan.edge_slots) - ({spec.edge} if spec.edge else set()):
        return None, 'edge_score reads other edge arguments'
    dims = 2 if spec.kind == 'gat' else 3
    value = tensors[plan.src_slots[plan.value_source]]
    score_src = tensors[plan.src_slots[spec.score]]
    score_dst = tensors[plan.dst_slots[spec.dst]]
    dtypes = {t.dtype for t in (value, score_src, score_dst)}
    if len(dtypes) != 1 or value.dtype not in (torch.float32, torch.float64):
        return None, f'dtypes {sorted(map(str, dtypes))}'
    if score_src.dim() != dims or score_dst.dim() != dims or \
            value.dim() != 3 or score_src.shape[1] != value.shape[1] or \
            (dims == 3 and not score_src.shape[1:] == score_dst.shape[1:]
             == value.shape[1:]):
        return None, 'score or value tables of unexpected shapes'
    if spec.att is not None and spec.att.dtype != value.dtype:
        return None, 'att dtype differs from the features'
    return spec, ''


def aggregator_for(plan: Plan, tensors) -> type:
    """:class:`FusedAttentionAggregator` where it applies, else the
    separate-operator :class:`AttentionAggregator`; logged once per layer
    class and choice."""
    spec, why = fused_spec(plan, tensors)
    impl = None
    if spec is not None:
        device = tensors[plan.src_slots[plan.value_source]].device
        impl, why = kernels.backend(device)
    name = type(plan.module).__name__
    said = (name, impl is not None, why)
    if said not in _SAID:
        _SAID.add(said)
        if impl is not None:
            log.info('pyg_sar: %s attention runs fused (%s)', name, why)
        else:
            log.info('pyg_sar: %s attention runs as separate operators '
                     '(%s)', name, why)
    if impl is None:
        return AttentionAggregator
    plan.fused = (spec, impl)
    return FusedAttentionAggregator


class FusedAttentionAggregator(AttentionAggregator):
    """The online softmax of :class:`AttentionAggregator` with one fused
    kernel per chunk in forward and two in backward (over destination rows,
    then over the chunk's sources); modes ``sar`` and ``one_shot``."""

    def __init__(self, plan: Plan, inputs: Inputs) -> None:
        self.spec, self.impl = plan.fused
        self.kind = kernels.KINDS[self.spec.kind]
        names = list(plan.src_slots)
        self.k_value = names.index(plan.value_source)
        self.k_score = names.index(self.spec.score)
        self.dst_slot = plan.dst_slots[self.spec.dst]
        self.edge_slot = (plan.edge_slots.get(self.spec.edge)
                          if self.spec.edge else None)
        super().__init__(plan, inputs)
        self.keep = False

    def heads_first(self) -> List[bool]:
        # The kernels gather a source's whole [H, C] row per edge: node-major
        # tables (one contiguous row, no head-major copy per block).
        return [False] * len(self.inputs.source_meta)

    def edge_cost(self) -> Tuple[int, int]:
        value = self.inputs.sources[self.k_value]
        heads, itemsize = value.shape[1], value.element_size()
        # Per edge: indices (CSR, transposed CSR and its permutation), the
        # dropout mask, w and ds; the edge term and its gradient.
        per_edge = 24 + 4 * heads * itemsize
        if self.edge_slot is not None:
            width = heads * (value.shape[2] if self.kind else 1)
            edge = self.inputs.tensors[self.edge_slot]
            per_edge += 4 * width * itemsize + 2 * (
                math.prod(edge.shape[1:]) * edge.element_size())
        return per_edge, math.prod(value.shape[1:]) * itemsize

    def row_limit(self) -> Optional[int]:
        return None  # no per-head node-sized products per chunk

    def _tables(self, tables: List[Tensor]):
        value = tables[self.k_value]
        s_src = tables[self.k_score]
        if value.stride(-1) != 1:
            value = value.contiguous()
        if s_src.stride(-1) != 1:
            s_src = s_src.contiguous()
        return s_src, self.inputs.tensors[self.dst_slot], value

    def _edge_term(self, chunk: EdgeChunk, grad: bool):
        if self.edge_slot is None:
            return None, None
        table = self.inputs.tensors[self.edge_slot]
        rows = table.index_select(0, chunk.edge_pos)
        wants = grad and self.inputs.needs_grad[self.edge_slot]
        if wants:
            rows.requires_grad_()
        with torch.set_grad_enabled(grad):
            term = self.plan.module.fused_edge_term(rows)
        if term is None:
            return None, None
        return term, (rows if wants else None)

    def _att(self, like: Tensor) -> Tensor:
        att = self.spec.att
        return like.new_empty(0) if att is None else \
            att.detach().reshape(att.shape[-2], att.shape[-1]).contiguous()

    def begin(self) -> None:
        value = self.inputs.sources[self.k_value]
        n, (heads, width) = self.graph.num_nodes, value.shape[1:]
        self.run_max = value.new_full((n, heads), float('-inf'))
        self.run_sum = value.new_zeros((n, heads))
        self.out = value.new_zeros((n, heads, width))

    def forward(self, block: EdgeBlock, tables: List[Tensor]) -> None:
        s_src, s_dst, value = self._tables(tables)
        att, empty = self._att(value), value.new_empty(0)
        for c_idx, chunk in enumerate(self.chunks(block)):
            if chunk.num_edges == 0:
                continue
            lo, hi = chunk.row_start, chunk.row_end
            crow, col = chunk.csr()
            edge, _ = self._edge_term(chunk, grad=False)
            mask = self._mask(block.key, c_idx, chunk, value)
            self.impl.forward(
                self.kind, crow, col, s_src, s_dst[lo:hi],
                empty if edge is None else edge.contiguous(), att, value,
                mask, self.run_max[lo:hi], self.run_sum[lo:hi],
                self.out[lo:hi], self.spec.param)

    def _mask(self, key, c_idx: int, chunk: EdgeChunk, like: Tensor):
        mask = self._dropout_mask(key, c_idx, like.new_empty(
            (chunk.num_edges, like.shape[1])))
        return like.new_empty(0) if isinstance(mask, float) else mask

    def backward(self, block: EdgeBlock, tables: Optional[List[Tensor]]
                 ) -> List[Tensor]:
        inputs = self.inputs
        acc = [self.transport.zeros(block.num_src, k)
               for k in range(len(inputs.source_meta))]
        s_src, s_dst, value = self._tables(tables)
        att, empty = self._att(value), value.new_empty(0)
        heads, width = value.shape[1:]
        gv = acc[self.k_value] if inputs.any_src_grad else empty
        gs = acc[self.k_score] if inputs.any_src_grad else empty
        att_param = self.spec.att
        want_att = att_param is not None and any(
            p is att_param for p in self.grad_params)
        for c_idx, chunk in enumerate(self.chunks(block)):
            if chunk.num_edges == 0:
                continue
            lo, hi = chunk.row_start, chunk.row_end
            crow, col = chunk.csr()
            crow_t, col_t, perm = chunk.csr_transposed(block.num_src)
            edge, edge_rows = self._edge_term(chunk, grad=True)
            edge_in = empty if edge is None else edge.detach().contiguous()
            mask = self._mask(block.key, c_idx, chunk, value)
            w = value.new_empty((chunk.num_edges, heads))
            ds = torch.empty_like(w)
            grad_dst = self._dst_grad(lo, hi, s_dst)
            grad_edge = (torch.empty_like(edge_in)
                         if self.kind != 0 and edge is not None else empty)
            grad_att = (value.new_zeros((torch.get_num_threads(), heads,
                                         width)) if self.kind == 1
                        else empty)
            self.impl.backward_rows(
                self.kind, crow, col, s_src, s_dst[lo:hi], edge_in, att,
                value, mask, self.run_max[lo:hi], self.run_sum[lo:hi],
                self.grad_out[lo:hi], self.delta[lo:hi], w, ds, grad_dst,
                grad_edge, grad_att, self.spec.param)
            if gv.numel() or gs.numel():
                self.impl.backward_cols(
                    self.kind, crow_t, col_t, perm, s_src, s_dst[lo:hi],
                    edge_in, att, self.grad_out[lo:hi], w, ds, gv, gs,
                    self.spec.param)
            if want_att:
                self._add_param(att_param, grad_att.sum(0).view_as(
                    att_param))
            if edge is not None:
                self._edge_backward(chunk, edge, edge_rows,
                                    ds if self.kind == 0 else grad_edge)
        return acc

    def _dst_grad(self, lo: int, hi: int, s_dst: Tensor) -> Tensor:
        """The destination terms' gradient rows ``[lo, hi)``, added into
        in place (a scratch slice when no gradient is wanted)."""
        slot = self.dst_slot
        if not self.inputs.needs_grad[slot]:
            return s_dst.new_zeros((hi - lo, *s_dst.shape[1:]))
        if slot not in self.local_grads:
            self.local_grads[slot] = torch.zeros_like(
                self.inputs.tensors[slot])
        return self.local_grads[slot][lo:hi]

    def _add_param(self, p: Tensor, value: Tensor) -> None:
        k = id(p)
        self.param_grads[k] = value if k not in self.param_grads \
            else self.param_grads[k] + value

    def _edge_backward(self, chunk: EdgeChunk, term: Tensor,
                       rows: Optional[Tensor], grad: Tensor) -> None:
        """Backpropagates the edge term's gradient into the edge rows and
        the parameters the term reads (``lin_edge``, ``att_edge``)."""
        targets = ([rows] if rows is not None else []) + list(
            self.grad_params)
        if not term.requires_grad or not targets:
            return
        res = torch.autograd.grad(term, targets, grad.view_as(term),
                                  allow_unused=True)
        if rows is not None:
            slot = self.edge_slot
            if slot not in self.local_grads:
                self.local_grads[slot] = torch.zeros_like(
                    self.inputs.tensors[slot])
            self.local_grads[slot].index_add_(0, chunk.edge_pos.long(),
                                              res[0])
            res = res[1:]
        for p, value in zip(self.grad_params, res):
            if value is not None:
                self._add_param(p, value)
