"""Turn a stock PyG model into one that runs over a :class:`~pyg_sar.DistGraph`.

Three kinds of module are converted, each keeping its constructor arguments,
weights, dtype, device, ``requires_grad`` flags and training mode (the
``state_dict`` keys do not change, so it loads back into the stock model):

* layers with a SAR-engine twin in :mod:`pyg_sar.nn` (``GCNConv``,
  ``SAGEConv``, ``GraphConv``, ``GINConv``, ``GATConv``, ``GATv2Conv``,
  ``TransformerConv``, ...):
  replaced by the twin where it implements the layer's configuration
  exactly (:func:`_twin_fits`); otherwise (an ``Aggregation`` module, a
  list, learnable aggregation parameters, ``aggr_kwargs``, another flow,
  hooks) adapted as below. Aggregations that read neighbors as a sequence
  (:data:`ORDERED_AGGREGATIONS`) are refused by name. Lazy (``-1``) input
  sizes stay lazy: they materialize on the first forward, and on the first
  distributed one the ranks check that they agree
  (:func:`agree_lazy_shapes`);
* layers that are exact over whole neighborhoods (:mod:`pyg_sar.nn.adapter`,
  with a source-side normalization where they need one,
  :mod:`pyg_sar.nn.gcn_norm`): adapted in place;
* node-mixing normalizations: replaced by versions with whole-graph
  statistics (:mod:`pyg_sar.nn.norm`).

Every other ``MessagePassing`` layer, and every module known to mix node
rows without a distributed version, is refused by name.
"""
import copy
import warnings
from typing import Any, Callable, Dict, Tuple, Type

import torch
import torch_geometric.nn as pyg_nn
import torch_geometric.nn.conv as pyg_conv
from torch.nn.parameter import UninitializedTensorMixin
from torch_geometric.nn import MessagePassing

from pyg_sar import comm
from pyg_sar.graph import DistGraph
from pyg_sar.nn.adapter import DistAdapter, adapt
from pyg_sar.nn.conv.cheb_conv import ChebConv
from pyg_sar.nn.conv.dir_gnn_conv import adapt_dir_gnn
from pyg_sar.nn.conv.gat_conv import GATConv
from pyg_sar.nn.conv.gatv2_conv import GATv2Conv
from pyg_sar.nn.conv.gcn_conv import GCNConv
from pyg_sar.nn.gcn_norm import NORMALIZED
from pyg_sar.nn.conv.gin_conv import GINConv
from pyg_sar.nn.conv.graph_conv import GraphConv
from pyg_sar.nn.message_passing import DistMessagePassing
from pyg_sar.nn.model_paths import MODEL_REFUSALS
from pyg_sar.nn.norm import NODE_MIXING_WITHOUT_DIST_VERSION, NORM_CONVERTERS
from pyg_sar.nn.plain import mark_calls, register_stock
from pyg_sar.nn.conv.hgt_conv import HGTConv
from pyg_sar.nn.conv.rgcn_conv import FastRGCNConv, RGCNConv
from pyg_sar.nn.conv.sage_conv import SAGEConv
from pyg_sar.nn.conv.transformer_conv import TransformerConv
from pyg_sar.utils.layer_guard import refuse_unconverted


def _gat_args(m) -> Dict:
    return dict(in_channels=m.in_channels, out_channels=m.out_channels,
                heads=m.heads, concat=m.concat,
                negative_slope=m.negative_slope, dropout=m.dropout,
                add_self_loops=m.add_self_loops, edge_dim=m.edge_dim,
                fill_value=m.fill_value, bias=m.bias is not None,
                residual=m.residual)


def _rgcn_args(m) -> Dict:
    return dict(in_channels=m.in_channels, out_channels=m.out_channels,
                num_relations=m.num_relations, num_bases=m.num_bases,
                num_blocks=m.num_blocks, aggr=m.aggr,
                root_weight=m.root is not None, is_sorted=m.is_sorted,
                bias=m.bias is not None)


# Imported for their registrations (pyg_sar.nn.adapter.register_adapted).
_REGISTERED = (ChebConv, )

# Layers with a SAR-engine twin: the twin class and the constructor
# arguments that rebuild a layer, read from a stock layer or a twin alike
# (a twin called on a plain graph runs its stock class built from them:
# pyg_sar.nn.plain).
_TWINS: Dict[Type, Tuple[Type, Callable[[Any], Dict[str, Any]]]] = {
    pyg_nn.SAGEConv: (SAGEConv, lambda m: dict(
        in_channels=m.in_channels, out_channels=m.out_channels,
        normalize=m.normalize, root_weight=m.root_weight, project=m.project,
        bias=m.lin_l.bias is not None, aggr=m.aggr)),
    pyg_nn.GCNConv: (GCNConv, lambda m: dict(
        in_channels=m.in_channels, out_channels=m.out_channels,
        improved=m.improved, cached=m.cached,
        add_self_loops=m.add_self_loops, normalize=m.normalize,
        bias=m.bias is not None)),
    pyg_nn.GraphConv: (GraphConv, lambda m: dict(
        in_channels=m.in_channels, out_channels=m.out_channels,
        bias=m.lin_rel.bias is not None, aggr=m.aggr)),
    pyg_nn.GINConv: (GINConv, lambda m: dict(
        nn=m.nn, eps=m.initial_eps,
        train_eps=isinstance(m.eps, torch.nn.Parameter))),
    pyg_nn.GATConv: (GATConv, _gat_args),
    pyg_nn.RGCNConv: (RGCNConv, _rgcn_args),
    pyg_nn.HGTConv: (HGTConv, lambda m: dict(
        in_channels=m.in_channels, out_channels=m.out_channels,
        metadata=(list(m.node_types), list(m.edge_types)), heads=m.heads)),
    pyg_nn.FastRGCNConv: (FastRGCNConv, _rgcn_args),
    pyg_nn.GATv2Conv: (GATv2Conv, lambda m: dict(
        **_gat_args(m), share_weights=m.share_weights)),
    pyg_nn.TransformerConv: (TransformerConv, lambda m: dict(
        in_channels=m.in_channels, out_channels=m.out_channels,
        heads=m.heads, concat=m.concat, beta=m.beta, dropout=m.dropout,
        edge_dim=m.edge_dim, bias=m.lin_key.bias is not None,
        root_weight=m.root_weight)),
}
for _stock, (_twin, _arguments) in _TWINS.items():
    register_stock(_twin, _stock, _arguments)


def _make_twin(module: torch.nn.Module) -> torch.nn.Module:
    """The engine twin of a stock layer, built with its constructor
    arguments (weights not copied)."""
    twin, arguments = _TWINS[type(module)]
    new = twin(**arguments(module))
    if isinstance(new, SAGEConv):
        # The transform_first opt-in (see SAGEConv) carries over.
        new.transform_first = bool(getattr(module, 'transform_first', False))
    return new


# Twins whose stock layer has no whole-neighborhood fallback here (typed
# edges): a configuration outside the twin is refused by name.
_TWIN_ONLY = (pyg_nn.RGCNConv, pyg_nn.FastRGCNConv, pyg_nn.HGTConv)
_TYPED_AGGRS = ('mean', 'sum', 'add', 'max', 'min')
# Aggregations that read neighbors as a sequence (refused, by name).
ORDERED_AGGREGATIONS = frozenset({
    'LSTMAggregation', 'GRUAggregation', 'SortAggregation',
    'GraphMultisetTransformer', 'MLPAggregation', 'SetTransformerAggregation',
    'LCMAggregation', 'PatchTransformerAggregation'})
_MP_HOOKS = ('_propagate_forward_pre_hooks', '_propagate_forward_hooks',
             '_message_forward_pre_hooks', '_message_forward_hooks',
             '_aggregate_forward_pre_hooks', '_aggregate_forward_hooks',
             '_message_and_aggregate_forward_pre_hooks',
             '_message_and_aggregate_forward_hooks',
             '_edge_update_forward_pre_hooks', '_edge_update_forward_hooks',
             '_forward_hooks', '_forward_pre_hooks', '_backward_hooks')

# Layers whose own forward is exact over whole neighborhoods (each one has
# an exactness test in tests/nn/test_zoo_exact.py).
ADAPTED = (
    pyg_nn.GINEConv, pyg_nn.EdgeConv,
    pyg_nn.ResGatedGraphConv, pyg_nn.GENConv, pyg_nn.PNAConv,
    pyg_nn.LEConv, pyg_nn.ClusterGCNConv, pyg_nn.GeneralConv, pyg_nn.CGConv,
    pyg_nn.NNConv, pyg_nn.SimpleConv, pyg_nn.AGNNConv, pyg_nn.FeaStConv,
    pyg_nn.MFConv, pyg_nn.FiLMConv, pyg_nn.GatedGraphConv, pyg_nn.GMMConv,
    pyg_nn.ChebConv, pyg_nn.PointNetConv, pyg_nn.PPFConv,
    pyg_nn.PointTransformerConv, pyg_nn.PointGNNConv, pyg_nn.WLConvContinuous,
    pyg_nn.RGATConv, pyg_nn.HEATConv,  # tests/nn/test_hetero_zoo_exact.py
)


# Stock classes refused outright: the models of torch_geometric.nn.models
# that a partition cannot run (pyg_sar/nn/model_paths.py); every class of
# torch_geometric.nn.conv that is not convertible is refused too.
# GPSConv converts: pyg_sar/nn/conv/gps_conv.py registers it.
REFUSED: tuple = tuple(MODEL_REFUSALS)
_CONV_CLASSES = {getattr(pyg_conv, name) for name in pyg_conv.__all__}
_KNN = 'builds a kNN graph over all nodes inside the layer'
_KERNEL = 'needs an optional compiled kernel package'
# Why each refused conv class is refused (named in the error).
REFUSAL_REASONS = {
    'CuGraphSAGEConv': _KERNEL, 'CuGraphGATConv': _KERNEL,
    'CuGraphRGCNConv': _KERNEL, 'FusedGATConv': _KERNEL,
    'SplineConv': _KERNEL, 'GravNetConv': _KNN, 'DynamicEdgeConv': _KNN,
    'XConv': _KNN,
    'HypergraphConv': 'aggregates over hyperedges (a hypergraph '
                      'incidence, not graph edges), not partitioned here',
    'PANConv': 'builds a path-integral adjacency (sums of powers of the '
               'whole adjacency) as a SparseTensor inside forward',
    'MeshCNNConv': 'convolves mesh edges, not graph nodes',
    **{cls.__name__: reason for cls, reason in MODEL_REFUSALS.items()},
}


# Stock containers of layers whose twin converts its children itself (it
# calls to_distributed, so this module cannot import it): the twin's module
# registers its converter here on import, and pyg_sar.nn imports it.
_COMPOSITE: Dict[type, Callable] = {}


def register_composite(cls: type, convert: Callable) -> None:
    """Registers ``convert(module, path, strict)``, the conversion of the
    stock container class ``cls`` (e.g. ``HeteroConv``)."""
    _COMPOSITE[cls] = convert


def convert_children(module: torch.nn.Module, prefix: str,
                     strict: bool) -> None:
    """Converts every child of ``module`` in place (``prefix``: the
    module's path in the model, for refusals)."""
    _convert_children(module, prefix, strict)


def convertible() -> tuple:
    """Every stock class :func:`to_distributed` converts."""
    return tuple(_TWINS) + ADAPTED + tuple(NORMALIZED) + tuple(
        NORM_CONVERTERS) + (pyg_nn.DirGNNConv, ) + tuple(_COMPOSITE)


def to_distributed(model: torch.nn.Module,
                   strict: bool = True) -> torch.nn.Module:
    """Converts, in place, every PyG layer of ``model`` that has a
    distributed version (see the module docs) and returns the model.

    The model's ``forward`` must hand its ``edge_index`` argument through to
    the convolutions: ``model(x, graph)`` then runs distributed with a
    :class:`pyg_sar.DistGraph`. Any other ``MessagePassing`` layer, or a
    module that mixes node rows without a distributed version, raises a
    ``ValueError`` naming it; with ``strict=False`` it is left in place with
    a warning (its results over a ``DistGraph`` are then the user's risk).

    The converted model is one model for both worlds
    (:mod:`pyg_sar.nn.plain`): called with a plain ``edge_index`` (a sampled
    batch) it computes what the stock model computes, bit for bit, with the
    same parameters, its normalizations taking the batch's statistics.
    """
    new = _convert_one(model, '', strict)
    if new is None:
        _convert_children(model, '', strict)
        new = model
    # Its normalizations tell a sampled batch from a DistGraph by the
    # model's call (pyg_sar.nn.plain.in_plain_call).
    return mark_calls(new)


def _convert_children(module: torch.nn.Module, prefix: str,
                      strict: bool) -> None:
    for name, child in list(module.named_children()):
        path = f'{prefix}{name}'
        new = _convert_one(child, path, strict)
        if new is not None:
            setattr(module, name, new)
        else:
            _convert_children(child, path + '.', strict)


def _convert_one(module: torch.nn.Module, path: str, strict: bool):
    """The converted module, or ``None`` when its children are to be
    walked instead."""
    cls = type(module)
    if isinstance(module, (DistMessagePassing, DistAdapter)):
        return module
    if isinstance(module, MessagePassing) and (
            cls in _TWINS or cls in NORMALIZED or cls in ADAPTED):
        _refuse_ordered_aggregation(module, path)
    if cls in _TWINS:
        fits = _twin_fits(module)
        if fits and (cls not in _TWIN_ONLY or module.aggr in _TYPED_AGGRS):
            return _rebuild(module, _make_twin)
        if cls in _TWIN_ONLY:
            raise ValueError(
                f"to_distributed: {cls.__name__}{_at(path)} with "
                f"aggr={module.aggr!r} (or another setting its pyg_sar "
                f"version does not take) is not supported; use aggr='mean', "
                f"'sum', 'max' or 'min'")
        # A configuration the twin does not implement (an Aggregation
        # module, a list of aggregations, aggr_kwargs, another flow or
        # node_dim, hooks) or a state its constructor cannot recreate
        # (DirGNNConv turns root_weight off after lin_r exists): the stock
        # forward, adapted (whole neighborhoods, exact).
        _convert_children(module, f'{path}.' if path else '', strict)
        return agree_lazy_shapes(adapt(module))
    if cls in NORM_CONVERTERS:
        return NORM_CONVERTERS[cls](module)
    if cls in NORMALIZED or cls in ADAPTED:
        _convert_children(module, f'{path}.' if path else '', strict)
        return agree_lazy_shapes(adapt(module))
    if cls in _COMPOSITE:
        return _COMPOSITE[cls](module, path, strict)
    if cls is pyg_nn.DirGNNConv:
        _convert_children(module, f'{path}.' if path else '', strict)
        return adapt_dir_gnn(module)
    refused = isinstance(module, (MessagePassing, REFUSED) + tuple(
        NODE_MIXING_WITHOUT_DIST_VERSION)) or cls in _CONV_CLASSES
    if not refused:
        return None
    where = f" at '{path}'" if path else ''
    what = ('mixes node rows and has no distributed version' if
            not isinstance(module, (MessagePassing, REFUSED)) and cls not in
            _CONV_CLASSES else 'has no distributed version in pyg_sar')
    reason = next((REFUSAL_REASONS[c.__name__] for c in cls.__mro__
                   if c.__name__ in REFUSAL_REASONS), None)
    if reason is not None:
        what += f' ({reason})'
    message = (f"to_distributed: {cls.__name__}{where} {what}; supported "
               f"layers: pyg_sar.nn.convert.convertible()")
    if isinstance(module, MessagePassing) and cls not in _CONV_CLASSES:
        message += ("; a layer of your own runs distributed when it "
                    "subclasses pyg_sar.nn.DistMessagePassing instead of "
                    "MessagePassing")
    if strict:
        raise ValueError(message)
    warnings.warn(message + ' (left unchanged: strict=False)')
    return module


def _at(path: str) -> str:
    return f" at '{path}'" if path else ''


def _refuse_ordered_aggregation(module, path: str) -> None:
    """Refuses what the whole-neighborhood path cannot run exactly:
    ``edge_updater`` with ``flow='target_to_source'``, and aggregations that read each destination's neighbors as an ordered
    sequence (PyG asks for ``edge_index`` sorted by destination) are
    refused: a partition renumbers and regroups the edges."""
    if module.flow != 'source_to_target' and \
            type(module).edge_update is not MessagePassing.edge_update:
        raise ValueError(
            f"to_distributed: {type(module).__name__}{_at(path)} with "
            f"flow='target_to_source' computes per-edge values in "
            f"edge_update(), which is not supported over a DistGraph; use "
            f"flow='source_to_target' on the reversed edge_index")
    aggr = getattr(module, 'aggr_module', None)
    for m in (aggr.modules() if isinstance(aggr, torch.nn.Module) else ()):
        if type(m).__name__ in ORDERED_AGGREGATIONS:
            raise ValueError(
                f"to_distributed: {type(module).__name__}{_at(path)} "
                f"aggregates with {type(m).__name__}, which reads each "
                f"destination's neighbors in edge order (edge_index sorted "
                f"by destination); a partition does not keep that order, so "
                f"it is not supported: use an order-free aggregation (e.g. "
                f"'mean', 'max', SoftmaxAggregation, MultiAggregation)")


def _mp_config(m) -> tuple:
    """What a MessagePassing layer's math depends on besides its
    parameters: aggregation (with its kwargs), flow and node_dim."""
    aggr = 'add' if m.aggr == 'sum' else m.aggr
    return (aggr, repr(m.aggr_module), m.flow, m.node_dim)


def _twin_fits(module: torch.nn.Module) -> bool:
    """Whether the engine twin implements this stock layer's configuration
    exactly: a plain string aggregation without learnable parameters, the
    same aggregation, flow and node_dim as the twin builds, no hooks, and
    the same ``state_dict`` (keys and initialized shapes)."""
    if not isinstance(getattr(module, 'aggr', None), str):
        return False  # a list of aggregations
    aggr = getattr(module, 'aggr_module', None)
    if aggr is not None and next(aggr.parameters(), None) is not None:
        return False  # learnable (buffers, e.g. a quantile, are compared)
    if any(hook is not refuse_unconverted
           for h in _MP_HOOKS
           for hook in (getattr(module, h, None) or {}).values()):
        return False  # (the guard sync_params installs is not a user's)
    make = _make_twin
    try:
        with torch.device('meta'):
            if isinstance(module, pyg_nn.GINConv):
                # Its constructor would reset the shared nn: probe with an
                # empty one (GINConv's nn is kept whole by _rebuild).
                probe = copy.copy(module)
                probe._modules = dict(module._modules, nn=torch.nn.Identity())
                twin = make(probe)
            else:
                twin = make(module)
    except Exception:  # the twin cannot be built with these arguments
        return False
    if not isinstance(twin, MessagePassing) or \
            _mp_config(twin) != _mp_config(module):
        return False
    ours, theirs = twin.state_dict(), module.state_dict()
    if isinstance(module, pyg_nn.GINConv):
        ours = {k: v for k, v in ours.items() if not k.startswith('nn.')}
        theirs = {k: v for k, v in theirs.items() if not k.startswith('nn.')}
    if set(ours) != set(theirs):
        return False
    return all(_lazy(v) or _lazy(theirs[k]) or v.shape == theirs[k].shape
               for k, v in ours.items())


def _lazy(t) -> bool:
    return isinstance(t, UninitializedTensorMixin)


def agree_lazy_shapes(module: torch.nn.Module) -> torch.nn.Module:
    """A layer with lazy (``-1``) input sizes infers them from its first
    input: on its first call with a :class:`~pyg_sar.DistGraph`, every rank
    checks (one gather) that all ranks see the same input widths, so that
    every rank materializes the same shapes (one clear error naming the
    layer and each rank's widths otherwise)."""
    if not any(_lazy(p) for p in module.parameters()):
        return module
    handle = module.register_forward_pre_hook(_agree_on_first_call,
                                              with_kwargs=True)
    module.__dict__['_sar_lazy_hook'] = handle.id
    return module


def _agree_on_first_call(module, args, kwargs):
    values = list(args) + list(kwargs.values())
    if not any(isinstance(v, DistGraph) for v in values):
        return None
    module._forward_pre_hooks.pop(module.__dict__.pop('_sar_lazy_hook'),
                                  None)
    widths = [tuple(t.shape[1:]) if isinstance(t, torch.Tensor) else None
              for v in values if not isinstance(v, DistGraph)
              for t in (v if isinstance(v, (tuple, list)) else [v])]
    comm.agree(f'initializing the lazy layer {type(module).__name__}',
               {f'input widths of {type(module).__name__}': widths})
    return None


def _rebuild(module: torch.nn.Module, make: Callable) -> torch.nn.Module:
    # Snapshot first: constructors reset parameters of shared submodules
    # (GINConv's nn).
    state = {k: v if _lazy(v) else v.clone()
             for k, v in module.state_dict().items()}
    flags = {k: p.requires_grad for k, p in module.named_parameters()}
    param = next((p for p in module.parameters() if not _lazy(p)), None)
    # The constructor's random initialization is overwritten by the state:
    # it must not advance the random state either (a lazy layer draws its
    # weights at its first forward, as in the stock model).
    with torch.random.fork_rng(devices=[]):
        new = make(module)
    if isinstance(module, pyg_nn.GINConv):
        to_distributed(module.nn)
    if param is not None:
        new = new.to(device=param.device, dtype=param.dtype)
    new.load_state_dict(state, strict=True)
    for name, p in new.named_parameters():
        if not _lazy(p):  # a lazy one takes its flag when materialized
            p.requires_grad_(flags.get(name, p.requires_grad))
    new.train(module.training)
    return agree_lazy_shapes(new)
