"""The SAR engine: one ``torch.autograd.Function`` for every mode and layer.

A layer's propagation visits the edge blocks of its :class:`DistGraph` one
source partition at a time (ring order: in round ``r`` a worker sends its rows
to ``rank + r`` and receives from ``rank - r``), aggregates each block into a
running result, and frees the fetched rows. Three kinds of aggregation:

* ``sum`` / ``mean`` / ``max`` / ``min`` of PyG messages, exact across blocks
  (max/min keep per-destination tie counts so the gradient is split exactly as
  ``torch.scatter_reduce`` splits it);
* a softmax over all in-edges of a destination, computed online (running max
  and sum per destination and head, rescaled as blocks arrive);
* a linear fast path for messages ``w_e * x_j``: sparse matrix products both
  ways, so neither forward nor backward materializes ``[E, F]`` messages and
  the backward sends ``A^T g`` without re-fetching anything.

Backward, per mode: ``"sar"`` re-fetches each block and recomputes it,
``"sa"`` reuses the per-block autograd graph kept in forward, and
``"one_shot"`` recomputes from the halo table of its single exchange.
Gradients of remote source rows go back to their owners, which sum what all
peers send.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, \
    Tuple

import warnings

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pyg_sar import comm
from pyg_sar.graph import DistGraph, EdgeBlock, EdgeChunk

SUPPORTED_AGGRS = ('sum', 'mean', 'max', 'min')
# CSR products are the point of the linear path; their beta notice is noise.
warnings.filterwarnings('ignore', '.*Sparse CSR tensor support is in beta.*')
warnings.filterwarnings('ignore', '.*Sparse invariant checks are implicitly.*')
_SPECIAL_ARGS = ('index', 'dim_size', 'size_i', 'ptr')
# PyG's softmax adds this to the normalizer; matching it keeps outputs equal.
_SOFTMAX_EPS = 1e-16
# Message channels: a re-fetch and a gradient send-back between the same two
# ranks can be in flight together.
_FETCH_TAG, _GRAD_TAG = 11, 12


@dataclass
class _Signature:
    """Which arguments a layer's message (and attention score) reads."""
    j_names: List[str]                 # ``x`` for an argument ``x_j``
    i_names: List[str]
    params: Dict[str, List[str]]       # method name -> its parameter names
    defaults: Dict[str, Any]


_SIGNATURES: Dict[type, _Signature] = {}


def _signature(module) -> _Signature:
    cls = type(module)
    if cls not in _SIGNATURES:
        methods = ['message'] + (['edge_score'] if module.attention else [])
        params, defaults = {}, {}
        j_names, i_names = [], []
        for method in methods:
            sig = inspect.signature(getattr(module, method))
            params[method] = [
                name for name, p in sig.parameters.items()
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            ]
            for name in params[method]:
                default = sig.parameters[name].default
                if default is not inspect.Parameter.empty:
                    defaults[name] = default
                if name.endswith('_j') and name[:-2] not in j_names:
                    j_names.append(name[:-2])
                elif name.endswith('_i') and name[:-2] not in i_names:
                    i_names.append(name[:-2])
        if not j_names:
            raise TypeError(f"{cls.__name__}.message() reads no *_j argument;"
                            f" nothing would flow along the edges")
        _SIGNATURES[cls] = _Signature(j_names, i_names, params, defaults)
    return _SIGNATURES[cls]


@dataclass
class _Plan:
    """Everything one propagation needs besides its differentiable inputs,
    which the Function receives as a flat list and the plan names by slot."""
    module: Any
    graph: DistGraph
    aggr: str
    sig: _Signature
    src_slots: Dict[str, int]
    dst_slots: Dict[str, int]
    edge_slots: Dict[str, int]
    param_slots: List[int]
    constants: Dict[str, Any]
    kind: str = 'general'          # 'general' | 'linear' | 'spmm' | 'attention'
    linear_weight: Optional[Tensor] = None
    # Attention whose values are the rows of this source tensor, unchanged:
    # aggregated with one sparse product per head, never gathered per edge.
    value_source: Optional[str] = None
    dropout: float = 0.0
    seed: int = 0


def _classify_aggr(module) -> str:
    aggr = module.aggr
    if isinstance(aggr, str):
        aggr = 'sum' if aggr == 'add' else aggr
        if aggr in SUPPORTED_AGGRS:
            return aggr
    raise ValueError(f"{type(module).__name__}: aggr={aggr!r} is not "
                     f"supported by DistMessagePassing; use one of "
                     f"{SUPPORTED_AGGRS}")


def propagate(module, graph: DistGraph, kwargs: Dict[str, Any]) -> Tensor:
    """Runs one distributed propagation of ``module`` over ``graph``."""
    if not isinstance(graph, DistGraph):
        raise TypeError(f"{type(module).__name__}.propagate expects a "
                        f"pyg_sar.DistGraph as first argument (got "
                        f"{type(graph).__name__}); build one with "
                        f"pyg_sar.DistGraph(part)")
    sig = _signature(module)
    aggr = 'sum' if module.attention else _classify_aggr(module)

    tensors: List[Tensor] = []
    slot_of: Dict[int, int] = {}

    def slot(t: Tensor) -> int:
        if id(t) not in slot_of:
            slot_of[id(t)] = len(tensors)
            tensors.append(t)
        return slot_of[id(t)]

    src_slots, dst_slots, edge_slots, constants = {}, {}, {}, {}
    for name in sig.j_names + sig.i_names:
        if name not in kwargs:
            raise TypeError(f"{type(module).__name__}.propagate() is missing "
                            f"argument {name!r} (read as {name}_j/{name}_i)")
        value = kwargs[name]
        src_val, dst_val = (value if isinstance(value, (tuple, list))
                            else (value, value))
        if name in sig.j_names:
            _check_node_tensor(module, name, src_val, graph)
            src_slots[name] = slot(src_val)
        if name in sig.i_names:
            _check_node_tensor(module, name, dst_val, graph)
            dst_slots[name] = slot(dst_val)
    for name in {n for names in sig.params.values() for n in names}:
        if name.endswith(('_i', '_j')) or name in _SPECIAL_ARGS:
            continue
        if name in kwargs:
            value = kwargs[name]
        elif name in sig.defaults:
            value = sig.defaults[name]
        else:
            raise TypeError(f"{type(module).__name__}.propagate() is missing "
                            f"argument {name!r} required by message()")
        if isinstance(value, Tensor) and name.startswith('edge_'):
            if value.shape[0] != graph.num_edges:
                raise ValueError(
                    f"edge-level argument {name!r} has {value.shape[0]} rows "
                    f"but the graph has {graph.num_edges} edges")
            edge_slots[name] = slot(value)
        else:
            constants[name] = value

    plan = _Plan(module, graph, aggr, sig, src_slots, dst_slots, edge_slots,
                 [], constants)
    if module.attention:
        plan.kind = 'attention'
        message_args = sig.params['message']
        if module.message_is_identity and len(message_args) == 1 and \
                message_args[0].endswith('_j') and \
                src_slots and tensors[src_slots[message_args[0][:-2]]
                                      ].dim() == 3:
            plan.value_source = message_args[0][:-2]
        plan.dropout = float(module.attention_dropout) \
            if module.training else 0.0
        if plan.dropout > 0:
            plan.seed = int(torch.randint(0, 2**62, (1, )))
    elif module.linear_message and aggr in ('sum', 'mean'):
        plan.kind = 'linear'
        wanted = inspect.signature(module.message_weight).parameters
        weight = module.message_weight(**{k: kwargs.get(k) for k in wanted})
        if weight is not NotImplemented:
            if len(src_slots) != 1:
                raise ValueError(f"{type(module).__name__}.message_weight "
                                 f"needs a message with exactly one *_j "
                                 f"argument")
            if isinstance(weight, Tensor) and weight.requires_grad:
                raise ValueError(
                    f"{type(module).__name__}.message_weight returned a "
                    f"tensor that requires grad; linear messages need fixed "
                    f"coefficients (set linear_message = False)")
            plan.kind, plan.linear_weight = 'spmm', weight
    if plan.kind in ('linear', 'spmm') and any(
            tensors[s].requires_grad
            for s in list(dst_slots.values()) + list(edge_slots.values())
            if s not in src_slots.values()):
        # A message linear in x_j is not linear in a learnable coefficient:
        # its gradient needs the real x_j, so recompute like any message.
        plan.kind, plan.linear_weight = 'general', None
    if plan.kind in ('general', 'attention'):
        plan.param_slots = [slot(p) for p in _message_parameters(module)]
    return SARFunction.apply(plan, *tensors)


def _check_node_tensor(module, name: str, value, graph: DistGraph) -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"{type(module).__name__}: argument {name!r} must be "
                        f"a tensor of node features (got "
                        f"{type(value).__name__})")
    if value.shape[0] != graph.num_nodes:
        raise ValueError(f"{type(module).__name__}: argument {name!r} has "
                         f"{value.shape[0]} rows but this worker owns "
                         f"{graph.num_nodes} nodes; pass features of the "
                         f"local nodes only")


def _message_parameters(module) -> List[Tensor]:
    names = module.message_parameters
    if names is None:
        return [p for p in module.parameters() if p.requires_grad]
    named = dict(module.named_parameters())
    missing = [n for n in names if n not in named and not _is_unset(module, n)]
    if missing:
        raise ValueError(f"{type(module).__name__}.message_parameters names "
                         f"{missing}, which are not parameters of the module")
    return [named[n] for n in names if n in named and named[n].requires_grad]


def _is_unset(module, dotted: str) -> bool:
    """An optional parameter (or its submodule) registered as ``None``."""
    obj = module
    for part in dotted.split('.'):
        obj = getattr(obj, part, None)
        if obj is None:
            return True
    return False


def _per_row(vector: Tensor, like: Tensor) -> Tensor:
    return vector.to(like.dtype).view(-1, *([1] * (like.dim() - 1)))


# The autograd function ########################################################

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
        return runner.forward()

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
        return (None, *runner.backward(grad_out.contiguous()))


class _Runner:
    """One propagation: its forward, the state it keeps, its backward."""

    def __init__(self, plan: _Plan, tensors: Sequence[Tensor],
                 needs_grad: Sequence[bool]) -> None:
        self.plan = plan
        self.graph = plan.graph
        self.mode = plan.graph.mode
        self.module = plan.module
        self.params = {s: tensors[s] for s in plan.param_slots}
        self.tensors = [t.detach() for t in tensors]
        self.needs_grad = list(needs_grad)
        self.src_names = list(plan.src_slots)
        self.sources = [self.tensors[s] for s in plan.src_slots.values()]
        # Row shape, dtype and device of each source tensor: what the
        # backward needs of them when it needs no values.
        self.source_meta = [(t.shape[1:], t.dtype, t.device)
                            for t in self.sources]
        self.num_inputs = len(self.tensors)
        self.max_chunk_edges = self._chunk_limit()
        self.state: Dict[str, Any] = {}
        self.any_src_grad = any(self.needs_grad[s]
                                for s in plan.src_slots.values())

    def _chunk_limit(self) -> Optional[int]:
        """Edges per chunk: the graph's ``chunk_size``, and for non-linear
        layers at most what keeps the chunk's temporaries inside the
        configured ``edge_memory_budget``: a few copies of every gathered
        row per edge and, on the sparse value path, of every output row of
        the destinations it touches."""
        if self.plan.kind == 'spmm':
            return None  # sparse products hold no per-edge features

        def row_bytes(tensors) -> int:
            return max([math.prod(t.shape[1:]) * t.element_size()
                        for t in tensors if t.dim() > 0] + [1])

        # Gathered rows, messages and their gradients coexist in backward.
        live_copies = 4
        if self.plan.value_source is None:
            per_edge = live_copies * row_bytes(self.tensors)
        else:
            # Only the score's inputs are gathered per edge (scores,
            # probabilities, masks and their gradients: twice as many);
            # values appear per destination row.
            gathered = [self.tensors[s] for s in self._slots_read('edge_score')]
            values = [self.tensors[self.plan.src_slots[
                self.plan.value_source]]]
            rows_per_edge = self.graph.num_nodes / max(self.graph.num_edges,
                                                       1)
            per_edge = int(2 * live_copies * row_bytes(gathered) +
                           live_copies * row_bytes(values) * rows_per_edge) + 1
        limit = max(1024, comm.config().edge_memory_budget // per_edge)
        chunk_size = self.graph.chunk_size
        return limit if chunk_size is None else min(limit, chunk_size)

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
        return block.chunked(self.max_chunk_edges)

    # Ring exchange ###########################################################

    def _rounds(self) -> List[int]:
        """Ring rounds in which this worker sends or receives anything; the
        peers of a round agree on it, so empty rounds cost nothing."""
        g = self.graph
        P = g.world_size
        return [r for r in range(1, P)
                if (g.rank - r) % P in g.recv_ids
                or (g.rank + r) % P in g.send_ids]

    def _post_fetch(self, rnd: int):
        g = self.graph
        to, frm = (g.rank + rnd) % g.world_size, (g.rank - rnd) % g.world_size
        return frm, g.post_row_exchange(self.sources, [to], [frm], _FETCH_TAG)

    def _fetched_rounds(self) -> Iterator[Tuple[int, Optional[EdgeBlock],
                                                Optional[List[Tensor]]]]:
        """Yields ``(round, block, tables)`` for every active ring round, with
        ``pipeline_depth`` rounds posted ahead; ``block`` is ``None`` in a
        round where this worker only sends."""
        rounds = self._rounds()
        depth = comm.config().pipeline_depth + 1
        pending: Dict[int, Any] = {}
        for k, rnd in enumerate(rounds):
            for ahead in rounds[k:k + depth]:
                if ahead not in pending:
                    pending[ahead] = self._post_fetch(ahead)
            frm, work = pending.pop(rnd)
            received = work.wait()
            block = self.graph.remote_block(frm)
            yield rnd, block, (received[frm] if block is not None else None)

    def _halo_tables(self) -> List[Tensor]:
        """``one_shot``: all remote rows in one exchange, stacked after the
        local rows in block order."""
        g, sources = self.graph, self.sources
        received = g.post_row_exchange(sources, g.send_ids, g.recv_ids,
                                       _FETCH_TAG).wait()
        return [torch.cat([sources[k]] +
                          [received[b.peer][k] for b in g.blocks[1:]])
                for k in range(len(sources))]

    def _blocks(self) -> Iterator[Tuple[EdgeBlock, List[Tensor]]]:
        """Every block with its source tables: one merged block for
        ``one_shot``, else the local block and then the ring."""
        if self.mode == 'one_shot':
            tables = self._halo_tables()
            if self.plan.kind in ('general', 'attention'):
                self.state['halo'] = tables  # recomputed from in backward
            yield self.graph.merged_block(), tables
            return
        yield self.graph.local_block, self.sources
        for _, block, tables in self._fetched_rounds():
            if block is not None:
                yield block, tables

    # Forward #################################################################

    def forward(self) -> Tensor:
        kind = self.plan.kind
        if kind == 'spmm':
            out = self._forward_spmm()
            # A linear backward needs no input values: let them go.
            self.tensors = self.sources = None
            return out
        if kind == 'attention':
            return self._forward_attention()
        return self._forward_reduce()

    def _keeps_graph(self) -> bool:
        return self.mode == 'sa' and self.plan.kind != 'linear' and \
            any(self.needs_grad)

    def _wants_grad(self, key: Tuple[str, Any]) -> bool:
        kind, ref = key
        slot_idx = self.plan.src_slots[ref] if kind == 'src' else ref
        return self.needs_grad[slot_idx]

    def _chunk_args(self, method: str, chunk: EdgeChunk,
                    tables: Dict[str, Tensor], made: Optional[Dict]
                    ) -> Dict[str, Any]:
        """The keyword arguments of ``method`` for one chunk. With ``made``
        (a dict, shared by the calls of one chunk), the gathered rows that
        need a gradient become autograd leaves recorded there as
        ``key -> (leaf, index)``: their gradients are scattered back with
        ``index``, so no full-size table gradient is built per chunk."""
        plan = self.plan
        args = {}
        for name in plan.sig.params[method]:
            base = name[:-2]
            if name.endswith('_j') and base in tables:
                key, table, index = ('src', base), tables[base], chunk.src
            elif name.endswith('_i') and base in plan.dst_slots:
                slot_idx = plan.dst_slots[base]
                key, table, index = (('dst', slot_idx),
                                     self.tensors[slot_idx], chunk.dst)
            elif name in plan.edge_slots:
                slot_idx = plan.edge_slots[name]
                key, table, index = (('edge', slot_idx),
                                     self.tensors[slot_idx], chunk.edge_pos)
            else:
                if name == 'index':
                    args[name] = chunk.dst
                elif name in ('dim_size', 'size_i'):
                    args[name] = self.graph.num_nodes
                elif name == 'ptr':
                    args[name] = None
                elif name in plan.constants:
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

    def _compute(self, chunk: EdgeChunk, tables: Dict[str, Tensor],
                 grad: bool) -> Tuple[Tuple[Tensor, ...], Dict]:
        """The chunk's messages (or ``(scores, values)`` for attention), and
        the gathered leaves they were computed from when ``grad``."""
        module = self.module
        made: Optional[Dict] = {} if grad else None
        with torch.set_grad_enabled(grad):
            if self.plan.kind == 'attention':
                outputs = (module.edge_score(**self._chunk_args(
                    'edge_score', chunk, tables, made)), )
                if self.plan.value_source is None:
                    outputs += (module.message(**self._chunk_args(
                        'message', chunk, tables, made)), )
            else:
                outputs = (module.message(**self._chunk_args(
                    'message', chunk, tables, made)), )
        return outputs, made

    def _named(self, tables: List[Tensor]) -> Dict[str, Tensor]:
        return dict(zip(self.src_names, tables))

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
                    kept.append((block.peer, chunk, c_idx, made, outputs,
                                 None))
                self._combine(out, count, outputs[0].detach(), chunk)
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
            out.index_add_(0, chunk.dst, msg)
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

    def _spmm_values(self, chunk: EdgeChunk, like: Tensor,
                     perm: Optional[Tensor] = None) -> Tensor:
        weight = self.plan.linear_weight
        if weight is None:
            return like.new_ones(chunk.num_edges)
        values = weight.index_select(0, chunk.edge_pos).to(like.dtype)
        return values if perm is None else values[perm]

    def _forward_spmm(self) -> Tensor:
        """Linear messages ``w_e * x_j``: one sparse product per chunk."""
        g = self.graph
        out = None
        for block, tables in self._blocks():
            x = tables[0]
            if out is None:
                out = x.new_zeros((g.num_nodes, *x.shape[1:]))
            flat = x.reshape(x.shape[0], -1)
            for chunk in self._chunks(block):
                if chunk.num_edges == 0:
                    continue
                crow, col = chunk.csr()
                adj = torch.sparse_csr_tensor(
                    crow, col, self._spmm_values(chunk, x),
                    (chunk.row_end - chunk.row_start, block.num_src))
                out[chunk.row_start:chunk.row_end] += (adj @ flat).view(
                    -1, *x.shape[1:])
        if self.plan.aggr == 'mean':
            out = out / _per_row(g.in_degree.clamp(min=1), out)
        return out

    def _forward_attention(self) -> Tensor:
        """Online softmax over all in-edges of each destination and head."""
        g = self.graph
        keep = self._keeps_graph()
        run_max = run_sum = out = None
        kept = []
        for block, tables in self._blocks():
            named = self._named(tables)
            heads = self._value_heads(named)
            for c_idx, chunk in enumerate(self._chunks(block)):
                outputs, made = self._compute(chunk, named, grad=keep)
                score = outputs[0]
                value = outputs[1] if heads is None else None
                if out is None:
                    run_max = score.new_full((g.num_nodes, *score.shape[1:]),
                                             float('-inf'))
                    run_sum = torch.zeros_like(run_max)
                    width = (value.shape[1:] if heads is None else
                             (heads.shape[0], heads.shape[2]))
                    out = score.new_zeros((g.num_nodes, *width))
                if chunk.num_edges == 0:
                    continue
                if keep:
                    kept.append((block.peer, chunk, c_idx, made, outputs,
                                 heads))
                score = score.detach()
                lo, hi = chunk.row_start, chunk.row_end
                rows = chunk.dst - lo
                idx = rows.view(-1, 1).expand_as(score)
                old_max = run_max[lo:hi]
                new_max = old_max.clone().scatter_reduce_(
                    0, idx, score, 'amax', include_self=True)
                scale = torch.where(new_max == float('-inf'),
                                    torch.zeros_like(new_max),
                                    torch.exp(old_max - new_max))
                weight = torch.exp(score - new_max.gather(0, idx))
                run_sum[lo:hi] = run_sum[lo:hi] * scale + torch.zeros_like(
                    old_max).scatter_add_(0, idx, weight)
                weight = weight * self._dropout_mask(block.peer, c_idx,
                                                     weight)
                part = out[lo:hi]  # a view: updated in place
                part.mul_(scale.unsqueeze(-1))
                if heads is None:
                    part.index_add_(0, rows,
                                    weight.unsqueeze(-1) * value.detach())
                else:
                    self._add_per_head_spmm(part, chunk, weight, heads)
                run_max[lo:hi] = new_max
        out = out / (run_sum + _SOFTMAX_EPS).unsqueeze(-1)
        self.state.update(out=out, run_max=run_max, run_sum=run_sum,
                          kept=kept)
        return out

    def _value_heads(self, tables: Dict[str, Tensor]) -> Optional[Tensor]:
        """The value rows head-major, ``[H, num_src, C]``, on the sparse
        value path: a view, so no copy of the table is made."""
        if self.plan.value_source is None:
            return None
        return tables[self.plan.value_source].transpose(0, 1)

    @staticmethod
    def _add_per_head_spmm(part: Tensor, chunk: EdgeChunk, weight: Tensor,
                           heads: Tensor) -> None:
        """Adds ``sum_j weight[e, h] * value[j, h]`` to each destination row
        of the chunk: one CSR product per head, no per-edge value rows."""
        crow, col = chunk.csr()
        shape = (chunk.row_end - chunk.row_start, heads.shape[1])
        for h in range(heads.shape[0]):
            adj = torch.sparse_csr_tensor(crow, col, weight[:, h].contiguous(),
                                          shape)
            part[:, h] += adj @ heads[h]

    def _dropout_mask(self, peer: int, c_idx: int, like: Tensor):
        """Attention dropout, replayable: the mask of a chunk depends only on
        the call's seed and the chunk's position."""
        p = self.plan.dropout
        if p <= 0:
            return 1.0
        gen = torch.Generator(device=like.device)
        gen.manual_seed((self.plan.seed * 1000003 + peer * 7919 + c_idx)
                        % (2**62))
        keep = torch.rand(like.shape, generator=gen, device=like.device,
                          dtype=like.dtype) >= p
        return keep.to(like.dtype) / (1.0 - p)

    # Backward ################################################################

    def backward(self, grad_out: Tensor) -> List[Optional[Tensor]]:
        g = self.graph
        if self.plan.aggr == 'mean':
            grad_out = grad_out / _per_row(g.in_degree.clamp(min=1),
                                           grad_out)
        self.grads: List[Optional[Tensor]] = [None] * self.num_inputs
        self.src_grads = [self._source_rows(g.num_nodes, k)
                          for k in range(len(self.source_meta))]
        if self.plan.kind == 'spmm':
            self._route(self._spmm_block_grad(grad_out))
        else:
            self._backward_general(grad_out)
        for name, s in self.plan.src_slots.items():
            self._add(s, self.src_grads[self.src_names.index(name)])
        return self.grads

    def _add(self, slot_idx: int, value: Optional[Tensor]) -> None:
        if value is None or not self.needs_grad[slot_idx]:
            return
        current = self.grads[slot_idx]
        self.grads[slot_idx] = value if current is None else current + value

    def _post_grads(self, sends: Dict[int, List[Tensor]],
                    from_peers: Sequence[int]):
        if not self.any_src_grad:  # every rank runs the same model
            sends, from_peers = {}, []
        g = self.graph
        shapes = {q: [((int(g.send_ids[q].numel()), *row), dtype)
                      for row, dtype, _ in self.source_meta]
                  for q in from_peers}
        return comm.post_exchange(sends, shapes, self.source_meta[0][2],
                                  _GRAD_TAG)

    def _source_rows(self, num_rows: int, k: int) -> Tensor:
        """Zeros shaped like ``num_rows`` rows of source tensor ``k``."""
        row, dtype, device = self.source_meta[k]
        return torch.zeros((num_rows, *row), dtype=dtype, device=device)

    def _receive_grads(self, pending) -> None:
        received = pending.wait()
        for frm, rows in received.items():
            ids = self.graph.send_ids[frm]
            for k, r in enumerate(rows):
                self.src_grads[k].index_add_(0, ids, r)

    def _route(self, block_grad: Callable[[EdgeBlock, Optional[List[Tensor]]],
                                          List[Tensor]],
               refetch: bool = False) -> None:
        """Computes every block's source-row gradients with ``block_grad``
        and routes them: local rows directly, remote rows back to their owner
        (in round ``r`` to ``rank - r``, while ``rank + r`` sends mine).
        With ``refetch``, each round first fetches the block's source rows
        again (``sar``)."""
        g = self.graph
        if self.mode == 'one_shot':
            merged = g.merged_block()
            table_grads = block_grad(merged, self.state.get('halo'))
            for k, tg in enumerate(table_grads):
                self.src_grads[k] += tg[:g.num_nodes]
            sends, offset = {}, g.num_nodes
            for block in g.blocks[1:]:
                sends[block.peer] = [tg[offset:offset + block.num_src]
                                     for tg in table_grads]
                offset += block.num_src
            self._receive_grads(self._post_grads(sends, list(g.send_ids)))
            return
        for k, tg in enumerate(block_grad(g.local_block, self.sources)):
            self.src_grads[k] += tg
        P = g.world_size
        if refetch:
            rounds = ((rnd, block, tables)
                      for rnd, block, tables in self._fetched_rounds())
        else:
            rounds = ((rnd, g.remote_block((g.rank - rnd) % P), None)
                      for rnd in self._rounds())
        pending = None
        for rnd, block, tables in rounds:
            # Finish the previous round's gradient exchange first: its
            # buffers are freed before this round's gradients are built.
            if pending is not None:
                self._receive_grads(pending)
                pending = None
            sends = ({block.peer: block_grad(block, tables)}
                     if block is not None else {})
            frm = (g.rank + rnd) % P
            pending = self._post_grads(sends, [frm] if frm in g.send_ids
                                       else [])
            del sends, tables
        if pending is not None:
            self._receive_grads(pending)

    def _spmm_block_grad(self, grad_out: Tensor):
        flat_g = grad_out.reshape(grad_out.shape[0], -1)
        trailing = self.source_meta[0][0]

        def block_grad(block: EdgeBlock, _tables) -> List[Tensor]:
            acc = flat_g.new_zeros((block.num_src, flat_g.shape[1]))
            for chunk in self._chunks(block):
                if chunk.num_edges == 0:
                    continue
                crow, col, perm = chunk.csr_transposed(block.num_src)
                adj_t = torch.sparse_csr_tensor(
                    crow, col, self._spmm_values(chunk, flat_g, perm),
                    (block.num_src, chunk.row_end - chunk.row_start))
                acc += adj_t @ flat_g[chunk.row_start:chunk.row_end]
            return [acc.view(block.num_src, *trailing)]

        return block_grad

    def _backward_general(self, grad_out: Tensor) -> None:
        """Recompute (or reuse) each chunk's messages, then backpropagate the
        analytic gradient of the aggregation through them."""
        plan = self.plan
        kept_by_peer: Dict[int, list] = {}
        for peer, *item in self.state.get('kept', []):
            kept_by_peer.setdefault(peer, []).append(item)
        params = ([] if plan.kind == 'linear' else
                  [p for p in self.params.values() if p.requires_grad])
        param_grads: Dict[int, Tensor] = {}
        # Gradients of destination and edge tensors, summed over chunks.
        local_grads: Dict[int, Tensor] = {}
        delta = ((grad_out * self.state['out']).sum(-1)
                 if plan.kind == 'attention' else None)

        def chunk_grads(peer, chunk, c_idx, tables, made, outputs,
                        acc: List[Tensor], heads: Optional[Tensor]) -> None:
            if outputs is None:
                outputs, made = self._compute(chunk, tables, grad=True)
            with torch.no_grad():
                if heads is not None:
                    k = self.src_names.index(plan.value_source)
                    grad_outputs = self._sparse_attention_grads(
                        peer, chunk, c_idx, outputs[0], grad_out, delta,
                        heads, acc[k] if self.any_src_grad else None)
                elif plan.kind == 'attention':
                    grad_outputs = self._attention_grads(
                        peer, chunk, c_idx, outputs, grad_out, delta)
                else:
                    grad_outputs = (self._reduce_grad(chunk, outputs[0],
                                                      grad_out), )
            keys = list(made)
            targets = [made[k][0] for k in keys] + params
            if not targets:
                return
            res = torch.autograd.grad(outputs, targets, grad_outputs,
                                      allow_unused=True)
            for key, value in zip(keys, res):
                if value is None:
                    continue
                kind, ref = key
                index = made[key][1]
                if kind == 'src':
                    acc[self.src_names.index(ref)].index_add_(0, index, value)
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
                for chunk, c_idx, made, outputs, heads in kept_by_peer.get(
                        block.peer, []):
                    chunk_grads(block.peer, chunk, c_idx, None, made,
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
                    chunk_grads(block.peer, chunk, c_idx, named, None, None,
                                acc, heads)
            return acc

        refetch = self.mode == 'sar' and plan.kind != 'linear'
        self._route(block_grad, refetch=refetch)
        for s, value in local_grads.items():
            self._add(s, value)
        for s, p in self.params.items():
            if id(p) in param_grads:
                self._add(s, param_grads[id(p)])

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

    def _probabilities(self, peer: int, chunk: EdgeChunk, c_idx: int,
                       score: Tensor):
        """The chunk's softmax probabilities, recomputed from the saved
        per-destination max and sum, and its replayed dropout mask."""
        m = self.state['run_max'].index_select(0, chunk.dst)
        s = self.state['run_sum'].index_select(0, chunk.dst) + _SOFTMAX_EPS
        prob = torch.exp(score.detach() - m) / s
        return prob, self._dropout_mask(peer, c_idx, prob)

    def _sparse_attention_grads(self, peer: int, chunk: EdgeChunk,
                                c_idx: int, score: Tensor, grad_out: Tensor,
                                delta: Tensor, heads: Tensor,
                                value_grad: Optional[Tensor]):
        """:meth:`_attention_grads` for values that are source rows: the
        value gradient ``A_h^T (p z) dO_h`` and the per-edge products
        ``dO_i . v_j`` (sampled dense-dense products) are taken per head on
        the chunk's sparsity pattern; only ``[E, H]`` tensors are built."""
        prob, mask = self._probabilities(peer, chunk, c_idx, score)
        weighted = prob * mask
        num_src = heads.shape[1]
        lo, hi = chunk.row_start, chunk.row_end
        g_heads = grad_out[lo:hi].transpose(0, 1)  # head-major view
        crow, col = chunk.csr()
        crow_t, col_t, perm = chunk.csr_transposed(num_src)
        pattern = torch.sparse_csr_tensor(
            crow, col, score.new_zeros(chunk.num_edges), (hi - lo, num_src))
        dot = torch.empty_like(prob)
        for h in range(heads.shape[0]):
            dot[:, h] = torch.sparse.sampled_addmm(
                pattern, g_heads[h], heads[h].t(), beta=0.0).values()
            if value_grad is not None:
                adj_t = torch.sparse_csr_tensor(
                    crow_t, col_t, weighted[perm, h].contiguous(),
                    (num_src, hi - lo))
                value_grad[:, h] += adj_t @ g_heads[h]
        grad_score = prob * (mask * dot - delta.index_select(0, chunk.dst))
        return (grad_score, )

    def _attention_grads(self, peer: int, chunk: EdgeChunk, c_idx: int,
                         outputs, grad_out: Tensor, delta: Tensor):
        """FlashAttention-style gradients of one chunk from the saved
        per-destination max and sum: ``dv = p z dO`` and
        ``da = p (z dO.v - D)`` with ``D = dO.out`` and dropout mask ``z``."""
        score, value = outputs
        prob, mask = self._probabilities(peer, chunk, c_idx, score)
        g_rows = grad_out.index_select(0, chunk.dst)
        grad_value = (prob * mask).unsqueeze(-1) * g_rows
        dot = (g_rows * value.detach()).sum(-1)
        grad_score = prob * (mask * dot - delta.index_select(0, chunk.dst))
        return grad_score, grad_value
