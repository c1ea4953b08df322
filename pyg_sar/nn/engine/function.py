"""The autograd function and what every aggregation shares.

:class:`SARFunction` is one ``torch.autograd.Function`` for every mode and
layer. It holds a propagation's :class:`Inputs` (the tensors, their
precision, their gradients) and its aggregator, an :class:`Aggregator`
subclass that the plan picked (:mod:`.plan`): :mod:`.sparse` (linear
messages as sparse products), :mod:`.reduce` (sum / mean / max / min of
general messages) or :mod:`.attention` (online softmax). An aggregator sees
blocks, never peers: ``forward(block, tables)`` folds one edge block into
its running result, ``backward(block, tables)`` returns the gradient of the
block's source tables, and the graph's
:class:`~pyg_sar.graph.transport.Transport` fetches the tables and routes
those gradients to their owners.

Backward, per mode: ``"sar"`` re-fetches each block and recomputes it,
``"sa"`` reuses the per-block autograd graph kept in forward, and
``"one_shot"`` recomputes from the halo table of its single exchange.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pyg_sar import comm
from pyg_sar.graph.blocks import EdgeBlock, EdgeChunk, power_of_two_at_most
from pyg_sar.graph.transport import Transport
from pyg_sar.nn.engine.spec import Plan
from pyg_sar.utils.malloc import trim_heap


class SARFunction(torch.autograd.Function):
    """Forward and backward of one propagation, for every mode and layer.

    Inputs: the plan, then the tensors it names by slot (source features,
    destination features, edge tensors, and the parameters its message
    reads). Output: the aggregated messages of the local nodes.
    """

    @staticmethod
    def forward(ctx, plan: Plan, *tensors: Tensor) -> Tensor:
        inputs = Inputs(plan, tensors, ctx.needs_input_grad[1:])
        aggregator = plan.aggregator(plan, inputs)
        ctx.aggregator, ctx.layer = aggregator, plan.module
        with comm.reusing_buffers(), inputs.full_precision():
            out = aggregator.run_forward()
        trim_heap()
        if plan.init_slot is not None:
            # The aggregate was added into this input's memory.
            out = tensors[plan.init_slot]
            ctx.mark_dirty(out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        aggregator: Aggregator = ctx.aggregator
        if aggregator is None:
            raise RuntimeError(
                f"pyg_sar: a second backward through "
                f"{type(ctx.layer).__name__}'s distributed propagation "
                f"(retain_graph=True) is not supported: the SAR engine frees "
                f"its state after the first backward; run the forward again")
        ctx.aggregator = None
        inputs = aggregator.inputs
        with comm.reusing_buffers(), inputs.full_precision():
            grads = aggregator.run_backward(grad_out.contiguous().to(
                inputs.compute_dtype or grad_out.dtype))
        del aggregator
        trim_heap()
        return (None, *grads)


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


def per_row(vector: Tensor, like: Tensor) -> Tensor:
    """A per-node vector shaped to scale the rows of ``like``."""
    return vector.to(like.dtype).view(-1, *([1] * (like.dim() - 1)))


class Inputs:
    """The differentiable inputs of one propagation and their gradients.

    Half-precision inputs (autocast) are computed in float32: the
    aggregation's sums and the softmax statistics never round to 16 bits.
    The float32 copies exist while a pass runs (:meth:`full_precision`);
    between forward and backward the inputs are kept as they came.
    """

    def __init__(self, plan: Plan, tensors: Sequence[Tensor],
                 needs_grad: Sequence[bool]) -> None:
        self.plan = plan
        self.params = {s: tensors[s] for s in plan.param_slots}
        self.stored: Optional[List[Tensor]] = [t.detach() for t in tensors]
        self.compute_dtype = compute_dtype(self.stored)
        self.use(self.upcast())
        self.needs_grad = list(needs_grad)
        self.src_names = list(plan.src_slots)
        # Row shape, dtype and device of each source tensor: what the
        # backward needs of them when it needs no values.
        self.source_meta = [(t.shape[1:], t.dtype, t.device)
                            for t in self.sources]
        self.any_src_grad = any(self.needs_grad[s]
                                for s in plan.src_slots.values())
        self.grads: List[Optional[Tensor]] = [None] * len(tensors)

    def upcast(self) -> List[Tensor]:
        """The inputs as they came, half-precision ones in
        :attr:`compute_dtype`."""
        if self.compute_dtype is None:
            return self.stored
        return [upcast(t, self.compute_dtype) for t in self.stored]

    def use(self, tensors: Optional[List[Tensor]]) -> None:
        """Computes from ``tensors`` (the sources are among them);
        ``None`` lets the inputs go (a linear backward needs no values)."""
        self.tensors = tensors
        self.sources = None if tensors is None else [
            tensors[s] for s in self.plan.src_slots.values()]
        if tensors is None:
            self.stored = None

    def device(self) -> torch.device:
        """The device this propagation computes on (its first input's)."""
        meta = self.source_meta
        return meta[0][2] if meta else torch.device('cpu')

    def full_precision(self) -> '_FullPrecision':
        """A context for one pass: autocast off (the engine computes in the
        dtypes it chose, recomputation included) and, for half-precision
        inputs, float32 copies made for the pass and dropped after it."""
        return _FullPrecision(self)

    def slots_read(self, method: str) -> List[int]:
        """The input slots the layer's ``method`` reads."""
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

    def add_grad(self, slot: int, value: Optional[Tensor]) -> None:
        """Adds ``value`` to the gradient of input ``slot`` (if it needs
        one)."""
        if value is None or not self.needs_grad[slot]:
            return
        current = self.grads[slot]
        self.grads[slot] = value if current is None else current + value


class _FullPrecision:
    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs
        self.device_type = inputs.device().type

    def __enter__(self):
        inputs = self.inputs
        # (The forward's copies were made with the inputs.)
        if inputs.compute_dtype is not None and inputs.stored is not None \
                and inputs.tensors is inputs.stored:
            inputs.use(inputs.upcast())
        self.autocast = torch.autocast(self.device_type, enabled=False)
        self.autocast.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.autocast.__exit__(*exc)
        inputs = self.inputs
        if inputs.compute_dtype is not None and inputs.stored is not None:
            inputs.use(inputs.stored)


class Aggregator:
    """One kind of aggregation over the blocks of a graph.

    Subclasses implement :meth:`begin` (the running result's state),
    :meth:`forward` (fold one block into it), :meth:`finish` (the output),
    and :meth:`backward` (a block's source-table gradients, given the
    output gradient set by :meth:`begin_backward`). This base runs both
    passes over the graph's :class:`Transport` and cuts blocks into chunks.

    Args:
        plan: the propagation (:class:`~pyg_sar.nn.engine.spec.Plan`).
        inputs: its :class:`Inputs`.
    """
    # Whether the backward of a remote block needs its source rows again
    # (``sar`` mode re-fetches them; the other modes keep what they need).
    needs_tables = False

    def __init__(self, plan: Plan, inputs: Inputs) -> None:
        self.plan = plan
        self.inputs = inputs
        self.graph = plan.graph
        self.mode = plan.graph.mode
        self.state: Dict[str, Any] = {}
        self.transport = Transport(
            plan.graph, inputs.source_meta, self.heads_first(),
            slice_rows=self.slice_rows(), keep_halo=self.needs_tables,
            sends_grads=inputs.any_src_grad)
        self.max_chunk_edges = self.chunk_limit()
        self.max_chunk_rows = self.row_limit()

    # What subclasses define ##################################################

    def begin(self) -> None:
        raise NotImplementedError

    def forward(self, block: EdgeBlock, tables: List[Tensor]) -> None:
        raise NotImplementedError

    def finish(self) -> Tensor:
        raise NotImplementedError

    def begin_backward(self, grad_out: Tensor) -> None:
        raise NotImplementedError

    def backward(self, block: EdgeBlock, tables: Optional[List[Tensor]]
                 ) -> List[Tensor]:
        raise NotImplementedError

    def end_backward(self) -> None:
        """Adds the gradients of non-source inputs (none by default)."""

    def heads_first(self) -> List[bool]:
        """Source tables that travel head-major (none by default)."""
        return [False] * len(self.inputs.source_meta)

    def slice_rows(self) -> Optional[int]:
        """Rows per halo slice (``None``: one exchange per peer)."""
        return None

    def edge_cost(self) -> Optional[Tuple[int, int]]:
        """``(bytes per edge, bytes of the widest row)`` of a chunk's
        temporaries; ``None`` when they hold no per-edge rows (the graph's
        ``chunk_size`` alone cuts blocks)."""
        return None

    def row_limit(self) -> Optional[int]:
        """Destination rows per chunk (``None``: not limited)."""
        return None

    # The two passes ##########################################################

    def run_forward(self) -> Tensor:
        self.begin()
        for block, tables in self.transport.blocks(self.inputs.sources):
            self.forward(block, tables)
            # This block's rows go before the ring posts the next fetch.
            del tables
        return self.finish()

    def run_backward(self, grad_out: Tensor) -> List[Optional[Tensor]]:
        plan, inputs = self.plan, self.inputs
        if plan.init_slot is not None:
            inputs.add_grad(plan.init_slot, grad_out)  # d(add_to + A x)
        self.begin_backward(grad_out)
        refetch = self.mode == 'sar' and self.needs_tables
        self.transport.route(self.backward, inputs.sources, refetch=refetch)
        self.end_backward()
        for slot, grad in zip(plan.src_slots.values(),
                              self.transport.source_grads()):
            inputs.add_grad(slot, grad)
        return inputs.grads

    # Chunks ##################################################################

    def chunks(self, block: EdgeBlock) -> List[EdgeChunk]:
        return block.chunked(self.max_chunk_edges, self.max_chunk_rows)

    def chunk_limit(self) -> Optional[int]:
        """Edges per chunk: the graph's ``chunk_size``, and at most what
        keeps the chunk's temporaries (:meth:`edge_cost`) inside
        the edge budget. The budget is :meth:`CommConfig.edge_budget`, the
        configured one capped at one node-sized table of the worker, so the
        chunk's temporaries fall with the worker's share of the graph, as
        its activations do."""
        cost = self.edge_cost()
        if cost is None:
            return None
        per_edge, widest = cost
        limit = max(1024, comm.config().edge_budget(
            self.graph.num_nodes, widest, self.inputs.device()) // per_edge)
        # A power of two: layers of similar widths then cut blocks alike and
        # share one set of cached chunk CSRs (EdgeBlock.chunked) instead of
        # keeping a set each.
        limit = power_of_two_at_most(limit)
        chunk_size = self.graph.chunk_size
        return limit if chunk_size is None else min(limit, chunk_size)


def widest_row(tensors: Sequence[Tensor]) -> int:
    """Bytes of the widest row among ``tensors`` (at least 1)."""
    return max([math.prod(t.shape[1:]) * t.element_size()
                for t in tensors if t.dim() > 0] + [1])
