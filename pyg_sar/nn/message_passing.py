"""``DistMessagePassing``: PyG's ``MessagePassing`` over a ``DistGraph``.

A graph partitioned from a weighted ``adj_t`` stands in for it
(:func:`fill_adj_t_values`): PyG's ``gcn2_cora`` example keeps normalized
edge weights as the values of ``adj_t`` (``T.GCNNorm()`` +
``T.ToSparseTensor()``) and calls ``conv(x, adj_t)``: a layer whose
``forward`` takes ``edge_weight`` then multiplies every message by the
value. A graph partitioned from such an ``adj_t``
(:mod:`pyg_sar.partition.input.pyg_inputs`) keeps the values as the edge
attribute ``edge_weight`` and marks them as ``adj_t``'s; its ``DistGraph``
carries them (``graph.adj_t_values``), and every layer that takes
``edge_weight`` and is called without one gets them, so the stock script's
call ``conv(x, graph)`` gets the same weights. Layers without an
``edge_weight`` argument (``SAGEConv``, ``GINConv``, ...) drop the values,
as PyG does for them. An ``edge_weight`` passed explicitly always wins.

Two compositions of a propagation with a linear map, which the layers use
to keep less than their stock form: :func:`linear_of_aggregate` computes
``lin(aggregate())`` without keeping the aggregate for the weight's
gradient when it can be recomputed (its input needs no gradient, as the
features entering a first layer): the aggregation runs once more in
backward instead (one node-sized tensor less per layer). :func:`add_linear_`
adds a layer's root term ``lin(x)`` into a fresh aggregate in one product
(``addmm_``): ``out + lin(x)`` first materializes ``lin(x)`` next to ``out``
and their sum, three node-sized tensors at once; the fused product holds
one.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn.parameter import UninitializedParameter
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.dense.linear import Linear as PyGLinear

from pyg_sar.graph import DistGraph
from pyg_sar.nn import engine
from pyg_sar.nn.neighborhood import log_once, propagate_on_graph
from pyg_sar.nn.plain import drop_stock_view, is_dist_graph, plain_forward

# Reads of these in ``message`` need every in-edge of a destination at once.
_NEIGHBORHOOD_ARGS = {'index', 'ptr', 'size_i', 'size_j', 'size', 'dim_size',
                      'edge_index', 'edge_index_i', 'edge_index_j', 'adj_t'}
_HOOKS = ('_propagate_forward_pre_hooks', '_propagate_forward_hooks',
          '_message_forward_pre_hooks', '_message_forward_hooks',
          '_aggregate_forward_pre_hooks', '_aggregate_forward_hooks')


class DistMessagePassing(MessagePassing):
    r"""Base class for message passing layers whose edges span workers.

    Subclasses write :meth:`message` (and :meth:`update`) exactly as for
    :class:`torch_geometric.nn.MessagePassing` and call
    ``self.propagate(graph, x=..., ...)`` with a :class:`pyg_sar.DistGraph`
    in place of ``edge_index``. Arguments read as ``*_j`` are fetched from the
    owners of the source nodes; ``*_i`` arguments are local; tensor arguments
    whose name starts with ``edge_`` are per-edge, in the graph's edge order;
    ``index``, ``ptr`` and ``dim_size``/``size_i`` mean what they mean in
    PyG. Everything :class:`~torch_geometric.nn.MessagePassing` lets a
    subclass do is exact:

    * messages aggregated by ``"sum"``/``"add"``, ``"mean"``, ``"max"``,
      ``"min"`` (and ``attention`` layers, below) run on the SAR engine,
      block by block, in the graph's mode;
    * everything else (any other aggregation or ``Aggregation`` module,
      ``flow="target_to_source"``, ``index``/``ptr``/``size_i`` read in
      ``message``, an overridden ``aggregate``, an ``update`` with extra
      arguments, propagate/message/aggregate hooks, ``decomposed_layers``,
      messages over another ``node_dim``, per-edge tensors not named
      ``edge_*``) runs PyG's own ``propagate`` over whole
      neighborhoods (:mod:`pyg_sar.nn.neighborhood`): the halo rows of the
      ``*_j`` inputs are fetched at once and destinations are processed in
      chunks of complete in-neighborhoods, checkpointed in ``"sar"`` mode.
      One log line per class says so.

    Called without a distributed graph (a plain ``edge_index``, a
    ``SparseTensor``: the local subgraph of a sampled batch), a layer runs
    stock PyG with the same parameters (:mod:`pyg_sar.nn.plain`): an engine
    twin runs its stock class's ``forward``, and a subclass of the user's
    own runs its ``forward`` with PyG's ``propagate`` and ``edge_updater``.

    Class attributes that tell the engine what it may skip:

    * ``linear_message``: the message is linear in its ``*_j`` inputs with
      coefficients that need no gradient (no trainable parameter inside
      ``message``). The backward then sends ``A^T g`` back without
      re-fetching or recomputing anything. Define :meth:`message_weight`
      too when the message is ``w_e * x_j``: both directions then run as
      sparse matrix products.
    * ``message_parameters``: names of the parameters read inside
      ``message``/``edge_score`` (``None``: all of the module's). The
      rematerialized backward produces their gradients.
    * ``attention``: softmax aggregation. The subclass defines
      :meth:`edge_score` (pre-softmax logits ``[E, H]``) and ``message``
      returns values ``[E, H, C]``; the output is
      ``sum_j softmax_j(score) * value`` per destination and head, with the
      softmax taken over all in-edges across workers, and
      ``attention_dropout`` applied to the probabilities. With
      ``message_is_identity`` (``message(x_j)`` returns ``x_j`` of shape
      ``[N, H, C]``; a message with other arguments returns it when they
      are all ``None``, e.g. ``message(x_j, edge_attr)`` called without
      edge features), values are aggregated by one sparse product per head
      and never gathered per edge.
    """

    # Called with a DistGraph by design (pyg_sar/utils/layer_guard.py).
    accepts_dist_graph = True
    linear_message: bool = False
    message_parameters: Optional[Sequence[str]] = None
    attention: bool = False
    attention_dropout: float = 0.0
    message_is_identity: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        forward = cls.__dict__.get('forward')
        if forward is not None and not getattr(
                forward, '__sar_plain_forward__', False):
            # A twin on a plain graph runs its stock class (pyg_sar.nn.plain).
            cls.forward = plain_forward(forward)

    def _set_jittable_templates(self, raise_on_error: bool = False) -> None:
        # PyG would render a propagate() template onto the concrete class,
        # replacing ours; distributed propagation is not template-generated.
        pass

    def reset_parameters(self) -> None:
        drop_stock_view(self)  # its caches (GCNConv's) go with it
        super().reset_parameters()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # A graph partitioned from a weighted adj_t hands its values to a
        # forward that takes edge_weight and is given none (fill_adj_t_values).
        args, kwargs = fill_adj_t_values(self.forward, args, kwargs)
        return super().__call__(*args, **kwargs)

    def propagate(self, graph: DistGraph, size=None, add_to: Optional[Tensor]
                  = None, **kwargs: Any) -> Tensor:
        """Aggregates messages into every local node (see class docs).

        ``add_to`` (a pyg_sar extension; a node-sized tensor shaped like the
        result): returns ``add_to + propagate(...)``. On the engine's sparse
        linear path (sum or mean of ``w_e * x_j``, the default ``update``)
        the aggregate is accumulated into ``add_to``'s memory, so a layer's
        root term and its aggregate need one node-sized buffer, not three;
        elsewhere it is the plain sum. Without a distributed graph
        (``edge_index``, ``SparseTensor``, ...): PyG's ``propagate``."""
        if not isinstance(graph, DistGraph):
            out = self._plain('propagate', graph, size, kwargs)
            return out if add_to is None else add_to + out
        _check_size(self, graph, size)
        _check_device(self, graph, kwargs)
        reason = self.neighborhood_reason(graph, kwargs)
        layer_wise = graph._layer_wise[0]
        if layer_wise is not None:
            _check_layer_wise(self, reason)
            graph = layer_wise.step(self, graph)
        if reason is None:
            if add_to is not None and layer_wise is None and \
                    type(self).update is DistMessagePassing.update:
                return engine.propagate(self, graph, kwargs, add_to=add_to)
            out = self.update(engine.propagate(self, graph, kwargs))
            return out if add_to is None else add_to + out
        if self.attention:
            raise ValueError(f"{type(self).__name__} (attention = True) "
                             f"does not support {reason} over a DistGraph")
        if graph.is_bipartite:
            raise ValueError(f"{type(self).__name__}: {reason} is not "
                             f"supported on a bipartite relation graph "
                             f"(source and destination types differ)")
        log_once(self, reason)
        out = propagate_on_graph(self, graph, kwargs)
        return out if add_to is None else add_to + out

    def edge_updater(self, graph: DistGraph, size=None, **kwargs: Any):
        """PyG's ``edge_updater`` over a :class:`DistGraph`: per-edge
        values in the graph's edge order (``edge_update`` sees every in-edge
        of a destination at once, so ``softmax(alpha, index)`` is exact)."""
        if not isinstance(graph, DistGraph):
            return self._plain('edge_updater', graph, size, kwargs)
        _check_size(self, graph, size)
        _check_device(self, graph, kwargs)
        if graph._layer_wise[0] is not None:
            _check_layer_wise(self, 'edge_updater')
        if graph.is_bipartite:
            raise ValueError(f"{type(self).__name__}: edge_updater is not "
                             f"supported on a bipartite relation graph")
        return propagate_on_graph(self, graph, kwargs, 'edge_updater')

    def _plain(self, what: str, edge_index, size, kwargs) -> Tensor:
        """PyG's own ``propagate``/``edge_updater`` on a plain graph."""
        name = type(self).__name__
        if is_dist_graph(edge_index):
            raise TypeError(f"{name}.{what} expects a pyg_sar.DistGraph or "
                            f"a plain edge_index (got "
                            f"{type(edge_index).__name__})")
        if self.attention:
            raise ValueError(
                f"{name} (attention = True) computes edge_score() over a "
                f"pyg_sar.DistGraph only; on a plain edge_index, PyG runs "
                f"message() alone: write the softmax in message() (as a "
                f"stock MessagePassing layer does) or pass a DistGraph")
        return getattr(MessagePassing, what)(self, edge_index, size=size,
                                             **kwargs)

    def neighborhood_reason(self, graph: DistGraph, kwargs) -> Optional[str]:
        """Why this call cannot be folded block by block by the SAR engine
        (``None``: it can)."""
        if self.flow != 'source_to_target':
            return "flow='target_to_source'"
        message = set(self.inspector.get_param_names('message'))
        read = message | (set(inspect.signature(self.edge_score).parameters)
                          if self.attention else set())
        special = sorted(read & _NEIGHBORHOOD_ARGS)
        if special:
            return f'message reads {special}'
        if self.attention:
            return None
        aggr = self.aggr
        if not (isinstance(aggr, str) and aggr in engine.SUPPORTED_AGGRS +
                ('add', )):
            return f'aggr={aggr!r}'
        if not any(a.endswith('_j') for a in message):
            return 'message reads no *_j argument'
        if type(self).aggregate is not MessagePassing.aggregate:
            return 'an overridden aggregate()'
        if self.inspector.get_param_names('update'):
            return 'update() with extra arguments'
        if any(getattr(self, h) for h in _HOOKS):
            return 'propagate hooks'
        if self.decomposed_layers > 1:
            return 'decomposed_layers > 1'
        node_args = [kwargs.get(a[:-2]) for a in message
                     if a.endswith(('_i', '_j'))]
        if self.node_dim not in (0, -2) or (self.node_dim == -2 and any(
                isinstance(t, Tensor) and t.dim() != 2
                for t in _flat(node_args))):
            return f'node_dim={self.node_dim}'
        for name in message:
            value = kwargs.get(name)
            if isinstance(value, Tensor) and value.dim() > 0 and \
                    value.size(0) == graph.num_edges and \
                    not name.startswith('edge_'):
                return f'per-edge argument {name!r} not named edge_*'
        return None

    def message_weight(self, **kwargs: Any):
        """For a ``linear_message`` of the form ``w_e * x_j``: the per-edge
        weight ``w`` (``[E]`` in graph edge order), or ``None`` for all ones.
        Arguments are taken by name from ``propagate``'s keyword arguments.
        ``NotImplemented`` (the default) selects the generic linear path."""
        return NotImplemented

    def edge_score(self, *args: Any, **kwargs: Any) -> Tensor:
        """Attention logits ``[E, H]`` (only for ``attention = True``)."""
        raise NotImplementedError(
            f"{type(self).__name__} sets attention = True but does not "
            f"define edge_score()")


def _flat(values):
    for v in values:
        if isinstance(v, (tuple, list)):
            yield from v
        else:
            yield v


def _check_size(module, graph: DistGraph, size) -> None:
    local = (graph.num_src_nodes, graph.num_nodes)
    if size is not None and tuple(size) != local:
        raise ValueError(f"{type(module).__name__}: size={tuple(size)} is "
                         f"not supported over a DistGraph (its local size "
                         f"is {local}); pass size=None")


def _check_device(module, graph: DistGraph, kwargs) -> None:
    """Features and the graph's index tensors must share a device (no index
    tensor is copied behind the user's back at every layer call)."""
    for name, value in kwargs.items():
        for v in _flat([value]):
            if isinstance(v, Tensor) and v.device != graph.device:
                raise ValueError(
                    f"{type(module).__name__}: '{name}' is on {v.device} but "
                    f"the DistGraph is on {graph.device}; move the graph "
                    f"with graph.to({str(v.device)!r}) (or build it with "
                    f"DistGraph(part, device=...))")


def _check_layer_wise(module, reason: Optional[str]) -> None:
    """Layer-wise MFGs stay exact only on the SAR engine, without attention
    dropout (its mask depends on the edges visited)."""
    name = type(module).__name__
    if reason is not None:
        raise ValueError(f"{name}: layer-wise MFGs need layers on the SAR "
                         f"engine (this call takes the whole-neighborhood "
                         f"path: {reason}); run it without layer_wise")
    if module.attention and module.attention_dropout > 0 and module.training:
        raise ValueError(f"{name}: attention dropout is not supported with "
                         f"layer-wise MFGs (its mask depends on the edges "
                         f"visited); set dropout=0 or run without layer_wise")


@functools.lru_cache(maxsize=None)
def _forward_signature(func: Callable) -> inspect.Signature:
    return inspect.signature(func)


def fill_adj_t_values(forward: Callable, args: Tuple,
                      kwargs: Dict[str, Any]) -> Tuple[Tuple, Dict[str, Any]]:
    r""":obj:`(args, kwargs)` of a call of :obj:`forward`, with
    :obj:`edge_weight` set to the graph's :obj:`adj_t_values` where the
    call passes a :class:`~pyg_sar.DistGraph` that has them, :obj:`forward`
    takes :obj:`edge_weight` and the call gives none."""
    target = getattr(forward, '__func__', forward)
    signature = _forward_signature(target)
    if 'edge_weight' not in signature.parameters:
        return args, kwargs
    graph = next((a for a in list(args) + list(kwargs.values())
                  if getattr(a, 'is_dist_graph', False) is True), None)
    values = getattr(graph, 'adj_t_values', None)
    if values is None:
        return args, kwargs
    owner = getattr(forward, '__self__', None)
    prefix = () if owner is None else (owner, )
    try:
        bound = signature.bind(*prefix, *args, **kwargs)
    except TypeError:
        return args, kwargs  # the call itself is wrong: let forward say so
    if bound.arguments.get('edge_weight') is not None:
        return args, kwargs
    bound.arguments['edge_weight'] = values
    return bound.args[len(prefix):], bound.kwargs


# Linear modules whose forward is exactly x @ W^T + b (a subclass that
# overrides forward goes through its own forward).
_PLAIN_FORWARDS = (PyGLinear.forward, torch.nn.Linear.forward)


def add_linear_(out: Tensor, x: Tensor, lin) -> Tensor:
    """``out += lin(x)`` in place for a PyG or torch ``Linear`` ``lin``, in
    one ``addmm_`` where ``out`` and ``x`` are matrices and ``lin`` is
    initialized (else ``out + lin(x)``). ``out`` must be a fresh result of
    the caller's (autograd refuses the in-place add at backward if anything
    saved it)."""
    weight = getattr(lin, 'weight', None)
    if (out.dim() == 2 and x.dim() == 2 and isinstance(weight, Tensor)
            and not isinstance(weight, UninitializedParameter)
            and type(lin).forward in _PLAIN_FORWARDS
            and out.dtype == x.dtype == weight.dtype):
        out = out.addmm_(x, weight.t())
        return out if lin.bias is None else out.add_(lin.bias)
    return out + lin(x)


def linear_of_aggregate(lin, aggregate: Callable[[], Tensor],
                        inputs: Tuple[Optional[Tensor], ...] = ()) -> Tensor:
    """``lin(aggregate())``, without keeping the aggregate for backward
    where it can be recomputed instead: when the aggregate needs no gradient
    (its input needs none, e.g. the input features of a first layer), the
    copy ``lin``'s weight gradient would save is dropped
    (``torch.autograd.graph.saved_tensors_hooks``) and :obj:`aggregate` is
    called again, without gradients, when backward needs it: one node-sized
    tensor less between forward and backward for one more aggregation (SAR's
    rematerialization). The gradients are those of ``lin(aggregate())``.

    :obj:`aggregate` must give the same result when called again (the same
    graph and input; a distributed aggregation runs its exchange again, on
    every rank at the same point of backward, as the engine's own backward
    does). :obj:`inputs` are the tensors :obj:`aggregate` reads: one
    changed in place between forward and backward would change the
    recomputed aggregate, so backward then raises, as autograd does for a
    saved tensor."""
    agg = aggregate()
    if agg.requires_grad or not torch.is_grad_enabled() or agg.dim() == 0:
        return lin(agg)
    key = (agg.data_ptr(), agg.shape, agg.stride(), agg.dtype)
    inputs = [t for t in inputs if isinstance(t, Tensor)]
    versions = [t._version for t in inputs]

    def pack(t: Tensor):
        if (t.data_ptr(), t.shape, t.stride(), t.dtype) == key:
            return _Recompute
        return t

    def unpack(saved):
        if saved is _Recompute:
            if [t._version for t in inputs] != versions:
                raise RuntimeError(
                    "An input of an aggregation was modified in place "
                    "after the forward pass; its aggregate, recomputed for "
                    "backward, would differ (pass a copy, or modify it "
                    "after backward)")
            with torch.no_grad():
                return aggregate()
        return saved

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = lin(agg)
    return out


class _Recompute:
    """Marker of a saved tensor that :func:`linear_of_aggregate`
    recomputes at backward."""
