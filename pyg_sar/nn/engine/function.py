"""The autograd function: one ``torch.autograd.Function`` for every mode and
layer, and the runner that carries one propagation from forward to backward.

The runner owns what is common to every kind of aggregation: the inputs and
their gradients, how edge blocks are cut into chunks, which kind's forward
runs, and the backward of general messages and attention (recompute or reuse
each chunk's messages, backpropagate the analytic gradient of the aggregation
through them). The kinds and the ring are mixins, one file each:
:mod:`.messages`, :mod:`.ring`, :mod:`.reduce`, :mod:`.sparse`,
:mod:`.attention`.

Backward, per mode: ``"sar"`` re-fetches each block and recomputes it,
``"sa"`` reuses the per-block autograd graph kept in forward, and
``"one_shot"`` recomputes from the halo table of its single exchange.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pyg_sar import comm
from pyg_sar.utils.malloc import trim_heap
from pyg_sar.comm.buffers import rows_shape
from pyg_sar.graph.blocks import power_of_two_at_most
from pyg_sar.graph.blocks import EdgeBlock, EdgeChunk
from pyg_sar.nn.engine.attention import AttentionMixin
from pyg_sar.nn.engine.messages import MessageMixin
from pyg_sar.nn.engine.reduce import ReduceMixin, _per_row
from pyg_sar.nn.engine.ring import RingMixin
from pyg_sar.nn.engine.sparse import SparseMixin
from pyg_sar.nn.engine.spec import Plan as _Plan


class SARFunction(torch.autograd.Function):
    """Forward and backward of one propagation, for every mode and layer.

    Inputs: the plan, then the tensors it names by slot (source features,
    destination features, edge tensors, and the parameters its message
    reads). Output: the aggregated messages of the local nodes.
    """

    @staticmethod
    def forward(ctx, plan: _Plan, *tensors: Tensor) -> Tensor:
        runner = _Runner(plan, tensors, ctx.needs_input_grad[1:])
        ctx.runner, ctx.layer = runner, plan.module
        with comm.reusing_buffers(), full_precision(runner):
            out = runner.forward()
        trim_heap()
        if plan.init_slot is not None:
            # The aggregate was added into this input's memory.
            out = tensors[plan.init_slot]
            ctx.mark_dirty(out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        runner: _Runner = ctx.runner
        if runner is None:
            raise RuntimeError(
                f"pyg_sar: a second backward through "
                f"{type(ctx.layer).__name__}'s distributed propagation "
                f"(retain_graph=True) is not supported: the SAR engine frees "
                f"its state after the first backward; run the forward again")
        ctx.runner = None
        with comm.reusing_buffers(), full_precision(runner):
            grads = runner.backward(grad_out.contiguous().to(
                runner.compute_dtype or grad_out.dtype))
        del runner
        trim_heap()
        return (None, *grads)


class _Runner(MessageMixin, RingMixin, ReduceMixin, SparseMixin,
              AttentionMixin):
    """One propagation: its forward, the state it keeps, its backward."""

    def __init__(self, plan: _Plan, tensors: Sequence[Tensor],
                 needs_grad: Sequence[bool]) -> None:
        self.plan = plan
        self.graph = plan.graph
        self.mode = plan.graph.mode
        self.module = plan.module
        self.params = {s: tensors[s] for s in plan.param_slots}
        self.tensors = [t.detach() for t in tensors]
        # Half-precision inputs (autocast) are computed in float32: the
        # aggregation's sums and the softmax statistics never round to 16
        # bits. The float32 copies exist while a pass runs; between forward
        # and backward the runner keeps the inputs as they came.
        self.compute_dtype = compute_dtype(self.tensors)
        self.stored = self.tensors
        self._use(self.upcast_inputs())
        self.needs_grad = list(needs_grad)
        self.src_names = list(plan.src_slots)
        # Row shape, dtype and device of each source tensor: what the
        # backward needs of them when it needs no values.
        self.source_meta = [(t.shape[1:], t.dtype, t.device)
                            for t in self.sources]
        # The attention value table is fetched, and its gradient built and
        # sent, head-major: its per-head products read and write it so.
        self.heads_first = [plan.kind == 'attention' and
                            name == plan.value_source
                            for name in self.src_names]
        self.num_inputs = len(self.tensors)
        self.max_chunk_edges = self._chunk_limit()
        self.max_chunk_rows = self._row_limit()
        self.state: Dict[str, Any] = {}
        self.any_src_grad = any(self.needs_grad[s]
                                for s in plan.src_slots.values())

    def upcast_inputs(self) -> List[Tensor]:
        """The inputs as they came, half-precision ones in
        :attr:`compute_dtype`."""
        if self.compute_dtype is None:
            return self.stored
        return [upcast(t, self.compute_dtype) for t in self.stored]

    def _use(self, tensors: Optional[List[Tensor]]) -> None:
        """Computes from ``tensors`` (the sources are among them)."""
        self.tensors = tensors
        self.sources = None if tensors is None else [
            tensors[s] for s in self.plan.src_slots.values()]

    def _chunk_limit(self) -> Optional[int]:
        """Edges per chunk: the graph's ``chunk_size``, and for non-linear
        layers at most what keeps the chunk's temporaries inside the edge
        budget: a few copies of every gathered row per edge and, on the
        sparse value path, of every output row of the destinations it
        touches. The budget is :meth:`CommConfig.edge_budget`, the
        configured one capped at one node-sized table of the worker, so the
        chunk's temporaries fall with the worker's share of the graph, as
        its activations do."""
        if self.plan.kind == 'spmm':
            return None  # sparse products hold no per-edge features

        def row_bytes(tensors) -> int:
            return max([math.prod(t.shape[1:]) * t.element_size()
                        for t in tensors if t.dim() > 0] + [1])

        # Gathered rows, messages and their gradients coexist in backward.
        live_copies = 4
        if self.plan.value_source is None:
            widest = row_bytes(self.tensors)
            per_edge = live_copies * widest
        else:
            # Only the score's inputs are gathered per edge (scores,
            # probabilities, masks and their gradients: twice as many);
            # values appear per destination row.
            gathered = [self.tensors[s] for s in self._slots_read('edge_score')]
            values = [self.tensors[self.plan.src_slots[
                self.plan.value_source]]]
            widest = row_bytes(values)
            rows_per_edge = self.graph.num_nodes / max(self.graph.num_edges,
                                                       1)
            per_edge = int(2 * live_copies * row_bytes(gathered) +
                           live_copies * widest * rows_per_edge) + 1
        limit = max(1024, comm.config().edge_budget(
            self.graph.num_nodes, widest, self._device()) // per_edge)
        # A power of two: layers of similar widths then cut blocks alike and
        # share one set of cached chunk CSRs (EdgeBlock.chunked) instead of
        # keeping a set each.
        limit = power_of_two_at_most(limit)
        chunk_size = self.graph.chunk_size
        return limit if chunk_size is None else min(limit, chunk_size)

    def _row_limit(self) -> Optional[int]:
        """Destination rows per chunk on the sparse value path of attention
        (``None`` elsewhere). Its per-head products build ``[rows,
        channels]`` results; a block with few edges per destination (a
        peer's block) would otherwise be one chunk over all of the worker's
        rows, whose per-head results are node-sized: mapped, faulted in and
        unmapped once per head. At most ``edge budget / 2 KiB`` rows
        (8,192 at 16 MiB), the same for every layer, so layers
        share one cut; a worker's own block, with many edges per row,
        reaches its edge limit first and is cut as before."""
        if self.plan.kind != 'attention' or self.plan.value_source is None:
            return None
        return power_of_two_at_most(
            max(16, comm.config().budget_for(self._device()) // 2048))

    def _device(self) -> torch.device:
        """The device this propagation computes on (its first input's)."""
        return self.tensors[0].device if self.tensors else \
            torch.device('cpu')

    def _slots_read(self, method: str) -> List[int]:
        plan, slots = self.plan, []
        for name in plan.sig.params[method]:
            base = name[:-2]
            if name.endswith('_j') and base in plan.src_slots:
                slots.append(plan.src_slots[base])
            elif name.endswith('_i') and base in plan.dst_slots:
                slots.append(plan.dst_slots[base])
            elif name in plan.edge_slots:
                slots.append(plan.edge_slots[name])
        return slots

    def _chunks(self, block: EdgeBlock) -> List[EdgeChunk]:
        return block.chunked(self.max_chunk_edges, self.max_chunk_rows)

    # Forward #################################################################

    def forward(self) -> Tensor:
        kind = self.plan.kind
        if kind == 'spmm':
            out = self._forward_spmm()
            # A linear backward needs no input values: let them go.
            self._use(None)
            return out
        if kind == 'attention':
            return self._forward_attention()
        return self._forward_reduce()

    def _keeps_graph(self) -> bool:
        return self.mode == 'sa' and self.plan.kind != 'linear' and \
            any(self.needs_grad)

    # Backward ################################################################

    def backward(self, grad_out: Tensor) -> List[Optional[Tensor]]:
        g = self.graph
        if self.plan.aggr == 'mean' and self.plan.kind != 'spmm':
            # (the sparse path folds 1 / in-degree into its edge values)
            grad_out = grad_out / _per_row(g.in_degree.clamp(min=1),
                                           grad_out)
        self.grads: List[Optional[Tensor]] = [None] * self.num_inputs
        # Filled by the first block's gradient itself (no zeros plus it).
        self.src_grads: List[Optional[Tensor]] = [None] * len(
            self.source_meta)
        if self.plan.init_slot is not None:
            self._add(self.plan.init_slot, grad_out)  # d(add_to + A x)
        if self.plan.kind == 'spmm':
            self._route(self._spmm_block_grad(grad_out))
        else:
            self._backward_general(grad_out)
        for name, s in self.plan.src_slots.items():
            k = self.src_names.index(name)
            if self.src_grads[k] is None:
                self.src_grads[k] = self._source_rows(g.num_src_nodes, k)
            self._add(s, self.src_grads[k])
        return self.grads

    def _add_src_rows(self, k: int, value: Tensor,
                      index: Optional[Tensor] = None) -> None:
        """Adds ``value`` to the gradient of source tensor ``k`` (at rows
        ``index``; all local rows without). A fresh full-size ``value``
        becomes the gradient itself."""
        current = self.src_grads[k]
        if index is None and current is None:
            self.src_grads[k] = value
        elif index is None:
            current += value
        else:
            if current is None:
                current = self.src_grads[k] = self._source_rows(
                    self.graph.num_src_nodes, k)
            _index_add_rows(current, index, value)

    def _add(self, slot_idx: int, value: Optional[Tensor]) -> None:
        if value is None or not self.needs_grad[slot_idx]:
            return
        current = self.grads[slot_idx]
        self.grads[slot_idx] = value if current is None else current + value

    def _source_rows(self, num_rows: int, k: int) -> Tensor:
        """Zeros shaped like ``num_rows`` rows of source tensor ``k``; for
        the attention value table (``heads_first``), a row-major view of
        head-major memory, which the per-head products add into."""
        row, dtype, device = self.source_meta[k]
        hf = self.heads_first[k]
        zeros = torch.zeros(rows_shape(num_rows, row, hf), dtype=dtype,
                            device=device)
        return zeros.transpose(0, 1) if hf else zeros

    def _backward_general(self, grad_out: Tensor) -> None:
        """Recompute (or reuse) each chunk's messages, then backpropagate the
        analytic gradient of the aggregation through them."""
        plan = self.plan
        kept_by_block: Dict[tuple, list] = {}
        for key, *item in self.state.get('kept', []):
            kept_by_block.setdefault(key, []).append(item)
        params = ([] if plan.kind == 'linear' else
                  [p for p in self.params.values() if p.requires_grad])
        param_grads: Dict[int, Tensor] = {}
        # Gradients of destination and edge tensors, summed over chunks.
        local_grads: Dict[int, Tensor] = {}
        delta = None
        if plan.kind == 'attention':
            # The output is needed for D = dO . out only: let it go before
            # the ring (the runner's one backward is its last use).
            delta = (grad_out * self.state.pop('out')).sum(-1)

        def chunk_grads(key, chunk, c_idx, tables, made, outputs,
                        acc: List[Tensor], heads: Optional[Tensor]) -> None:
            if outputs is None:
                outputs, made = self._compute(chunk, tables, grad=True)
            with torch.no_grad():
                if heads is not None:
                    k = self.src_names.index(plan.value_source)
                    grad_outputs = self._sparse_attention_grads(
                        key, chunk, c_idx, outputs[0], grad_out, delta,
                        heads, acc[k] if self.any_src_grad else None)
                elif plan.kind == 'attention':
                    grad_outputs = self._attention_grads(
                        key, chunk, c_idx, outputs, grad_out, delta)
                else:
                    grad_outputs = (self._reduce_grad(chunk, outputs[0],
                                                      grad_out), )
            keys = list(made)
            targets = [made[k][0] for k in keys] + params
            # Outputs that depend on nothing differentiable (raw features
            # into a message that reads no parameter) have no gradient.
            pairs = [(o, g) for o, g in zip(outputs, grad_outputs)
                     if o.requires_grad]
            if not targets or not pairs:
                return
            res = torch.autograd.grad([o for o, _ in pairs], targets,
                                      [g for _, g in pairs],
                                      allow_unused=True)
            for key, value in zip(keys, res):
                if value is None:
                    continue
                kind, ref = key
                # int64 (block indices may be int32): index_add_ on CPU is
                # 3x slower with an int32 index.
                index = made[key][1].long()
                if kind == 'src':
                    _index_add_rows(acc[self.src_names.index(ref)], index,
                                    value)
                else:
                    if ref not in local_grads:
                        local_grads[ref] = torch.zeros_like(self.tensors[ref])
                    local_grads[ref].index_add_(0, index, value)
            for p, value in zip(params, res[len(keys):]):
                if value is not None:
                    k = id(p)
                    param_grads[k] = value if k not in param_grads \
                        else param_grads[k] + value

        def block_grad(block: EdgeBlock, tables: Optional[List[Tensor]]
                       ) -> List[Tensor]:
            acc = [self._source_rows(block.num_src, k)
                   for k in range(len(self.source_meta))]
            if self.mode == 'sa' and plan.kind != 'linear':
                for chunk, c_idx, made, outputs, heads in kept_by_block.get(
                        block.key, []):
                    chunk_grads(block.key, chunk, c_idx, None, made,
                                outputs, acc, heads)
                return acc
            if plan.kind == 'linear':
                # The VJP of a linear message does not depend on the source
                # rows: evaluate it at zero, nothing re-fetched.
                tables = [torch.zeros_like(a) for a in acc]
            named = self._named(tables)
            heads = self._value_heads(named)
            for c_idx, chunk in enumerate(self._chunks(block)):
                if chunk.num_edges > 0:
                    chunk_grads(block.key, chunk, c_idx, named, None, None,
                                acc, heads)
            return acc

        refetch = self.mode == 'sar' and plan.kind != 'linear'
        self._route(block_grad, refetch=refetch)
        for s, value in local_grads.items():
            self._add(s, value)
        for s, p in self.params.items():
            if id(p) in param_grads:
                self._add(s, param_grads[id(p)])


HALF = (torch.float16, torch.bfloat16)


def compute_dtype(tensors: Sequence[Tensor]) -> Optional[torch.dtype]:
    """``torch.float32`` when a floating input is half precision (float16,
    bfloat16), else ``None`` (computed in the inputs' own dtypes)."""
    if any(t.dtype in HALF for t in tensors):
        return torch.float32
    return None


def upcast(t: Tensor, dtype: torch.dtype) -> Tensor:
    """A half-precision tensor in ``dtype``; any other tensor as it is."""
    return t.to(dtype) if t.dtype in HALF else t


class full_precision:
    """Runs a pass of ``runner`` with autocast off (the engine computes in
    the dtypes it chose, recomputation included) and, for half-precision
    inputs, on float32 copies made for the pass and dropped after it."""

    def __init__(self, runner: '_Runner') -> None:
        self.runner = runner
        self.device_type = runner.stored[0].device.type \
            if runner.stored else 'cpu'

    def __enter__(self):
        runner = self.runner
        # (The forward's copies were made with the runner.)
        if runner.compute_dtype is not None and runner.stored is not None \
                and runner.tensors is runner.stored:
            runner._use(runner.upcast_inputs())
        self.autocast = torch.autocast(self.device_type, enabled=False)
        self.autocast.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.autocast.__exit__(*exc)
        runner = self.runner
        if runner.tensors is None:
            runner.stored = None  # a linear backward needs no input values
        elif runner.compute_dtype is not None:
            runner._use(runner.stored)


def _index_add_rows(target: Tensor, index: Tensor, value: Tensor) -> None:
    """``target.index_add_(0, index, value)``; a row-major view of
    head-major memory is added into along its heads' rows instead (CPU
    ``index_add_`` into a strided view is several times slower)."""
    if target.dim() > 2 and not target.is_contiguous() and \
            target.transpose(0, 1).is_contiguous():
        target.transpose(0, 1).index_add_(1, index, value.transpose(0, 1))
    else:
        target.index_add_(0, index, value)
