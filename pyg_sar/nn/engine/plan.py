"""Plan building: what one propagation reads, and how it will be run.

:func:`propagate` reads the signature of the layer's ``message`` (and, for
attention layers, ``edge_score``), sorts the call's keyword arguments into
source rows (``x_j``), destination rows (``x_i``), edge tensors (``edge_*``)
and constants, picks the kind of aggregation (general messages, a linear
message, a sparse product, or attention) and the aggregator that runs it
(:data:`AGGREGATORS`), and hands the plan and the flat list of its
differentiable inputs to :class:`SARFunction`.
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional

import torch
from torch import Tensor

from pyg_sar.graph import DistGraph
from pyg_sar.nn.engine.attention import AttentionAggregator
from pyg_sar.nn.engine.fused import aggregator_for
from pyg_sar.nn.engine.function import SARFunction, compute_dtype
from pyg_sar.nn.engine.reduce import ReduceAggregator
from pyg_sar.nn.engine.sparse import SparseAggregator
from pyg_sar.nn.engine.spec import Plan, Signature

# The aggregator of each kind of plan.
AGGREGATORS = {'spmm': SparseAggregator, 'linear': ReduceAggregator,
               'general': ReduceAggregator, 'attention': AttentionAggregator}

SUPPORTED_AGGRS = ('sum', 'mean', 'max', 'min')
_SPECIAL_ARGS = ('index', 'dim_size', 'size_i', 'ptr')


_SIGNATURES: Dict[type, Signature] = {}


def _signature(module) -> Signature:
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
        _SIGNATURES[cls] = Signature(j_names, i_names, params, defaults)
    return _SIGNATURES[cls]


def _classify_aggr(module) -> str:
    aggr = module.aggr
    if isinstance(aggr, str):
        aggr = 'sum' if aggr == 'add' else aggr
        if aggr in SUPPORTED_AGGRS:
            return aggr
    raise ValueError(f"{type(module).__name__}: aggr={aggr!r} is not "
                     f"supported by DistMessagePassing; use one of "
                     f"{SUPPORTED_AGGRS}")


def propagate(module, graph: DistGraph, kwargs: Dict[str, Any],
              add_to: Optional[Tensor] = None) -> Tensor:
    """Runs one distributed propagation of ``module`` over ``graph``;
    returns ``add_to`` plus it when given (accumulated in ``add_to``'s
    memory on the sparse linear path)."""
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
            _check_node_tensor(module, name, src_val, graph.num_src_nodes,
                               'source ' if graph.is_bipartite else '')
            src_slots[name] = slot(src_val)
        if name in sig.i_names:
            _check_node_tensor(module, name, dst_val, graph.num_nodes,
                               'destination ' if graph.is_bipartite else '')
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

    plan = Plan(module, graph, aggr, sig, src_slots, dst_slots, edge_slots,
                 [], constants)
    if module.attention:
        plan.kind = 'attention'
        # message_is_identity: message returns its one *_j argument when
        # every other argument it reads is None in this call.
        message_args = sig.params['message']
        sources = [a for a in message_args if a.endswith('_j')]
        if module.message_is_identity and len(sources) == 1 and all(
                a in constants and constants[a] is None
                for a in message_args if a not in sources) and \
                tensors[src_slots[sources[0][:-2]]].dim() == 3:
            plan.value_source = sources[0][:-2]
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
    half = compute_dtype(tensors) is not None
    if add_to is not None and plan.kind == 'spmm' and not half:
        source = tensors[next(iter(src_slots.values()))]
        shape = (graph.num_nodes, *source.shape[1:])
        if tuple(add_to.shape) != shape or add_to.dtype != source.dtype:
            raise ValueError(
                f"{type(module).__name__}.propagate: add_to has shape "
                f"{tuple(add_to.shape)} ({add_to.dtype}) but the aggregate "
                f"is {shape} ({source.dtype})")
        if id(add_to) in slot_of or add_to._base is not None or (
                add_to.is_leaf and add_to.requires_grad):
            # An input, a view or a leaf is never written over.
            add_to = add_to.clone()
        plan.init_slot = slot(add_to)
    plan.aggregator = AGGREGATORS[plan.kind]
    if plan.kind == 'attention' and not half:
        # The fused kernels where the layer's score is one they compute.
        plan.aggregator = aggregator_for(plan, tensors)
    out = SARFunction.apply(plan, *tensors)
    if half:
        # Computed in float32; returned in the dtype PyG's own propagate
        # would give: its inputs' promotion (bfloat16 rows with float32
        # attention scores or edge weights give float32).
        out = out.to(_result_dtype(tensors, plan))
    if add_to is not None and plan.init_slot is None:
        out = add_to + out
    return out


def _result_dtype(tensors: List[Tensor], plan: Plan) -> torch.dtype:
    """The promotion of the floating node and edge inputs (and of a
    linear message's edge weights): the dtype of PyG's messages."""
    slots = set(plan.src_slots.values()) | set(plan.dst_slots.values()) | \
        set(plan.edge_slots.values())
    dtypes = [tensors[s].dtype for s in slots
              if tensors[s].is_floating_point()]
    weight = plan.linear_weight
    if isinstance(weight, Tensor) and weight.is_floating_point():
        dtypes.append(weight.dtype)
    out = dtypes[0]
    for dtype in dtypes[1:]:
        out = torch.promote_types(out, dtype)
    return out


def _check_node_tensor(module, name: str, value, num_rows: int,
                       kind: str) -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"{type(module).__name__}: argument {name!r} must be "
                        f"a tensor of node features (got "
                        f"{type(value).__name__})")
    if value.shape[0] != num_rows:
        raise ValueError(f"{type(module).__name__}: argument {name!r} has "
                         f"{value.shape[0]} rows but this worker owns "
                         f"{num_rows} {kind}nodes; pass features of the "
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
