"""One model for both worlds: a converted layer on a plain (local) graph.

A model converted by :func:`~pyg_sar.nn.to_distributed` runs distributed
when its layers are called with a :class:`~pyg_sar.DistGraph` (or a
``HeteroDistGraph``), and runs stock PyG when they are called with anything
else: an ``edge_index`` tensor, a ``SparseTensor``, a ``torch.sparse``
adjacency, an ``edge_index_dict``, e.g. the local subgraph of a sampled
mini-batch. The same ``Parameter`` objects serve both, so a model trained on
sampled batches infers over the whole ``DistGraph`` without a copy, and the
other way round.

An engine twin (:class:`~pyg_sar.nn.SAGEConv`, ...) knows its stock class
(:func:`register_stock`). Called on a plain graph it runs the stock class's
``forward`` on a *stock view* of itself (:func:`stock_view`): an instance of
the stock class, built once without drawing random numbers, whose
parameters, buffers, submodules and propagation hooks are the twin's own
(the same dictionaries, so a lazy ``-1`` size materializes the twin's
parameter, and ``.to()``/``load_state_dict`` are seen at once). The view is
no submodule (the ``state_dict`` keys do not change); it keeps its own
non-tensor state, e.g. the normalization that ``GCNConv(cached=True)``
caches, so the cache of a ``DistGraph`` is never used for a batch or the
other way round (a deep copy or pickle of the layer copies the view with
its cache, as it copies a stock layer's). Results are the stock layer's, bit for bit, with the same
dropout draws. Layers adapted from their stock class
(:mod:`pyg_sar.nn.adapter`) run their own stock ``forward`` already.

A :class:`~pyg_sar.nn.DistMessagePassing` subclass of the user's own (no
stock class) runs its own ``forward``; its ``propagate`` and
``edge_updater`` on a plain graph are PyG's.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.typing import SparseTensor

# Attributes of MessagePassing that a user or PyG's explain API may change
# after construction: the view reads them from the twin at every call.
_LIVE = ('training', '_explain', '_edge_mask', '_loop_mask',
         '_apply_sigmoid', '_decomposed_layers')
_SHARED = ('_parameters', '_buffers', '_modules',
           '_non_persistent_buffers_set', '_propagate_forward_pre_hooks',
           '_propagate_forward_hooks', '_message_forward_pre_hooks',
           '_message_forward_hooks', '_aggregate_forward_pre_hooks',
           '_aggregate_forward_hooks',
           '_message_and_aggregate_forward_pre_hooks',
           '_message_and_aggregate_forward_hooks',
           '_edge_update_forward_pre_hooks', '_edge_update_forward_hooks')
_VIEW = '_sar_stock_view'

# twin class -> (stock class, constructor keyword arguments of an instance)
_STOCK: Dict[type, Tuple[type, Callable[[Any], Dict[str, Any]]]] = {}


def register_stock(twin: type, stock: type,
                   arguments: Callable[[Any], Dict[str, Any]]) -> None:
    """Makes ``stock`` the class that an instance of ``twin`` runs on a
    plain graph; ``arguments(layer)`` gives the constructor keyword
    arguments of ``stock`` that build the same layer (read from a twin or
    a stock instance alike)."""
    _STOCK[twin] = (stock, arguments)


def stock_class(twin: type) -> Optional[type]:
    """The stock PyG class registered for ``twin`` (``None``: none)."""
    entry = _STOCK.get(twin)
    return None if entry is None else entry[0]


def is_dist_graph(value: Any) -> bool:
    """Whether ``value`` is a distributed graph (``DistGraph``,
    ``HeteroDistGraph`` or anything that says it is one)."""
    return getattr(value, 'is_dist_graph', False) is True


def holds_dist_graph(args: Tuple, kwargs: Dict[str, Any]) -> bool:
    """Whether a call's arguments hold a distributed graph (directly or in a
    tuple, list or dict)."""
    for value in list(args) + list(kwargs.values()):
        if is_dist_graph(value):
            return True
        inner = value.values() if isinstance(value, dict) else (
            value if isinstance(value, (tuple, list)) else ())
        if any(is_dist_graph(v) for v in inner):
            return True
    return False


def stock_view(module: torch.nn.Module) -> torch.nn.Module:
    """The stock PyG layer that shares ``module``'s parameters, buffers,
    submodules and hooks (see the module docs); built on first use and
    again whenever the constructor arguments it was built from change."""
    stock, arguments = _STOCK[type(module)]
    kwargs = arguments(module)
    cached = module.__dict__.get(_VIEW)
    if cached is None or not _same(cached[0], kwargs):
        cached = (kwargs, _build(module, stock, kwargs))
        module.__dict__[_VIEW] = cached  # no submodule: no state_dict keys
    view = cached[1]
    for name in _LIVE:
        if name in module.__dict__:
            view.__dict__[name] = module.__dict__[name]
    return view


def drop_stock_view(module: torch.nn.Module) -> None:
    """Forgets the stock view (and its caches): the next plain call builds
    it again (``reset_parameters``)."""
    module.__dict__.pop(_VIEW, None)


def _same(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    return all(x is y or (not isinstance(x, torch.nn.Module)
                          and type(x) is type(y) and x == y)
               for x, y in ((a[k], b[k]) for k in a))


def _build(module: torch.nn.Module, stock: type,
           kwargs: Dict[str, Any]) -> torch.nn.Module:
    # Submodule arguments (GINConv's nn) are the twin's own: the view gets
    # a placeholder, whose reset touches nothing of the twin's; built on
    # the meta device, drawing no random numbers.
    placeholder = {k: torch.nn.Identity() if isinstance(v, torch.nn.Module)
                   else v for k, v in kwargs.items()}
    with torch.random.fork_rng(devices=[]), torch.device('meta'):
        view = stock(**placeholder)
    for name in _SHARED:
        if name in module.__dict__:
            view.__dict__[name] = module.__dict__[name]
    return view


def plain_forward(forward: Callable) -> Callable:
    """Wraps a :class:`~pyg_sar.nn.DistMessagePassing` subclass's
    ``forward``: a call without a distributed graph runs the stock class's
    ``forward`` on the layer's :func:`stock_view` (the layer's own
    ``forward`` for a class without a stock class). A subclass of a twin
    (its class not registered itself) is refused on a plain graph: the
    stock class would not run what the subclass changed."""

    @functools.wraps(forward)
    def dispatch(self, *args: Any, **kwargs: Any):
        if holds_dist_graph(args, kwargs):
            return forward(self, *args, **kwargs)
        cls = type(self)
        if cls in _STOCK:
            return stock_view(self).forward(*args, **kwargs)
        twin = next((c for c in cls.__mro__[1:] if c in _STOCK), None)
        if twin is not None:
            raise TypeError(
                f"{cls.__name__} subclasses {twin.__module__}."
                f"{twin.__name__}, which runs stock "
                f"{_STOCK[twin][0].__module__}.{_STOCK[twin][0].__name__} "
                f"on a plain graph; a subclass runs over a pyg_sar.DistGraph "
                f"only (pass one, or subclass the stock layer for local "
                f"graphs)")
        return forward(self, *args, **kwargs)

    dispatch.__sar_plain_forward__ = True
    return dispatch


# Whether each call under way of a converted model's root is on a plain
# graph (innermost last): node-mixing normalizations, which see no graph,
# read it (in_plain_call).
_CALLS: list = []


def in_plain_call() -> bool:
    """Whether the innermost call under way of a model converted by
    :func:`~pyg_sar.nn.to_distributed` that holds a graph holds a plain one
    (a sampled batch's ``edge_index``, adjacency or ``edge_index_dict``),
    not a distributed one: its normalizations then take the batch's own
    statistics, as the stock modules do, instead of whole-graph ones. A
    call that holds no graph at all (a converted norm or MLP called on node
    rows) says nothing: it follows the call around it, and on its own keeps
    whole-graph statistics."""
    for plain in reversed(_CALLS):
        if plain is not None:
            return plain
    return False


def _is_plain_graph(value: Any) -> bool:
    # An edge_index ([2, E] integers), a torch.sparse adjacency or a
    # torch_sparse SparseTensor.
    if isinstance(value, Tensor):
        return value.layout != torch.strided or (
            value.dim() == 2 and value.size(0) == 2 and
            not value.is_floating_point() and not value.is_complex() and
            value.dtype != torch.bool)
    return isinstance(value, SparseTensor)


def holds_plain_graph(args: Tuple, kwargs: Dict[str, Any]) -> bool:
    """Whether a call's arguments hold a plain graph (see
    :func:`in_plain_call`; directly or in a dict such as an
    ``edge_index_dict``)."""
    for value in list(args) + list(kwargs.values()):
        inner = value.values() if isinstance(value, dict) else (value, )
        if any(_is_plain_graph(v) for v in inner):
            return True
    return False


def mark_calls(model: torch.nn.Module) -> torch.nn.Module:
    """Makes every call of ``model`` (the root that
    :func:`~pyg_sar.nn.to_distributed` returns) say whether it holds a
    distributed graph, for :func:`in_plain_call`; once per model."""
    if not getattr(model, '_sar_marks_calls', False):
        model.register_forward_pre_hook(_enter, with_kwargs=True)
        model.register_forward_hook(_leave, always_call=True)
        model.__dict__['_sar_marks_calls'] = True
    return model


def _enter(module, args, kwargs) -> None:
    # True: a plain graph, False: a distributed one, None: no graph.
    _CALLS.append(False if holds_dist_graph(args, kwargs) else
                  True if holds_plain_graph(args, kwargs) else None)


def _leave(module, args, output) -> None:
    if _CALLS:
        _CALLS.pop()
