"""Turn a stock PyG model into one that runs over a :class:`~pyg_sar.DistGraph`.

Three kinds of module are converted, each keeping its constructor arguments,
weights, dtype, device, ``requires_grad`` flags and training mode (the
``state_dict`` keys do not change, so it loads back into the stock model):

* layers with a SAR-engine twin in :mod:`pyg_sar.nn` (``GCNConv``,
  ``SAGEConv``, ``GraphConv``, ``GINConv``, ``GATConv``, ``GATv2Conv``):
  replaced by the twin;
* layers that are exact over whole neighborhoods (:mod:`pyg_sar.nn.adapter`,
  with a source-side normalization where they need one,
  :mod:`pyg_sar.nn.gcn_norm`): adapted in place;
* node-mixing normalizations: replaced by versions with whole-graph
  statistics (:mod:`pyg_sar.nn.norm`).

Every other ``MessagePassing`` layer, and every module known to mix node
rows without a distributed version, is refused by name.
"""
import warnings
from typing import Callable, Dict, Type

import torch
import torch_geometric.nn as pyg_nn
import torch_geometric.nn.conv as pyg_conv
from torch_geometric.nn import MessagePassing

from pyg_sar.nn.adapter import DistAdapter, adapt
from pyg_sar.nn.conv.cheb_conv import ChebConv  # noqa: F401 (registers)
from pyg_sar.nn.conv.dir_gnn_conv import adapt_dir_gnn
from pyg_sar.nn.conv.gat_conv import GATConv
from pyg_sar.nn.conv.gatv2_conv import GATv2Conv
from pyg_sar.nn.conv.gcn_conv import GCNConv
from pyg_sar.nn.gcn_norm import NORMALIZED
from pyg_sar.nn.conv.gin_conv import GINConv
from pyg_sar.nn.conv.graph_conv import GraphConv
from pyg_sar.nn.message_passing import DistMessagePassing
from pyg_sar.nn.norm import NODE_MIXING_WITHOUT_DIST_VERSION, NORM_CONVERTERS
from pyg_sar.nn.conv.hgt_conv import HGTConv
from pyg_sar.nn.conv.rgcn_conv import FastRGCNConv, RGCNConv
from pyg_sar.nn.conv.sage_conv import SAGEConv


def _aggr(module) -> Dict:
    return {'aggr': module.aggr}


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


def _with_transform_first(stock, twin):
    """Carries the ``transform_first`` opt-in (see :class:`SAGEConv`) of
    a stock layer over to its twin."""
    twin.transform_first = bool(getattr(stock, 'transform_first', False))
    return twin


# Layers with a SAR-engine twin, rebuilt with their own constructor args.
_TWINS: Dict[Type, Callable] = {
    pyg_nn.SAGEConv: lambda m: _with_transform_first(m, SAGEConv(
        m.in_channels, m.out_channels, normalize=m.normalize,
        root_weight=m.root_weight, project=m.project,
        bias=m.lin_l.bias is not None, **_aggr(m))),
    pyg_nn.GCNConv: lambda m: GCNConv(
        m.in_channels, m.out_channels, improved=m.improved, cached=m.cached,
        add_self_loops=m.add_self_loops, normalize=m.normalize,
        bias=m.bias is not None),
    pyg_nn.GraphConv: lambda m: GraphConv(
        m.in_channels, m.out_channels, bias=m.lin_rel.bias is not None,
        **_aggr(m)),
    pyg_nn.GINConv: lambda m: GINConv(m.nn, eps=m.initial_eps,
                                      train_eps=isinstance(
                                          m.eps, torch.nn.Parameter)),
    pyg_nn.GATConv: lambda m: GATConv(**_gat_args(m)),
    pyg_nn.RGCNConv: lambda m: RGCNConv(**_rgcn_args(m)),
    pyg_nn.HGTConv: lambda m: HGTConv(
        m.in_channels, m.out_channels, (list(m.node_types),
                                        list(m.edge_types)), heads=m.heads),
    pyg_nn.FastRGCNConv: lambda m: FastRGCNConv(**_rgcn_args(m)),
    pyg_nn.GATv2Conv: lambda m: GATv2Conv(
        **_gat_args(m), share_weights=m.share_weights),
}

# Layers whose own forward is exact over whole neighborhoods (each one has
# an exactness test in tests/test_zoo_exact.py).
ADAPTED = (
    pyg_nn.GINEConv, pyg_nn.TransformerConv, pyg_nn.EdgeConv,
    pyg_nn.ResGatedGraphConv, pyg_nn.GENConv, pyg_nn.PNAConv,
    pyg_nn.LEConv, pyg_nn.ClusterGCNConv, pyg_nn.GeneralConv, pyg_nn.CGConv,
    pyg_nn.NNConv, pyg_nn.SimpleConv, pyg_nn.AGNNConv, pyg_nn.FeaStConv,
    pyg_nn.MFConv, pyg_nn.FiLMConv, pyg_nn.GatedGraphConv, pyg_nn.GMMConv,
    pyg_nn.ChebConv, pyg_nn.PointNetConv, pyg_nn.PPFConv,
    pyg_nn.PointTransformerConv, pyg_nn.PointGNNConv, pyg_nn.WLConvContinuous,
)


# Not per-destination: heterogeneous dispatch, global attention over all
# nodes (every other class of torch_geometric.nn.conv that is not
# convertible is refused too).
REFUSED = (pyg_nn.GPSConv, )
_CONV_CLASSES = {getattr(pyg_conv, name) for name in pyg_conv.__all__}
_KNN = 'builds a kNN graph over all nodes inside the layer'
_KERNEL = 'needs an optional compiled kernel package'
_HETERO = 'heterogeneous or relational (see the heterogeneous-graph work)'
_SOURCE_NORM = ('normalizes by source-side degrees inside forward, not yet '
                'distributed')
# Why each refused conv class is refused (named in the error).
REFUSAL_REASONS = {
    'CuGraphSAGEConv': _KERNEL, 'CuGraphGATConv': _KERNEL,
    'CuGraphRGCNConv': _KERNEL, 'FusedGATConv': _KERNEL,
    'SplineConv': _KERNEL, 'GravNetConv': _KNN, 'DynamicEdgeConv': _KNN,
    'XConv': _KNN,
    'RGATConv': _HETERO, 'HEATConv': _HETERO,
    'HANConv': _HETERO,
    'SignedConv': 'takes two edge sets (positive and negative)',
    'HypergraphConv': 'aggregates over hyperedges, not edges',
    'PANConv': 'needs a SparseTensor path-integral adjacency',
    'WLConv': 'hashes colors in a table over all nodes',
    'SuperGATConv': 'samples negative edges over all nodes in training',
    'MeshCNNConv': 'convolves mesh edges, not graph nodes',
    'GPSConv': 'global attention over all nodes',
    'EGConv': _SOURCE_NORM, 'PDNConv': _SOURCE_NORM, 'DNAConv': _SOURCE_NORM,
    'AntiSymmetricConv': 'calls an inner conv on its own edge_index',
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
        NORM_CONVERTERS) + (pyg_nn.DirGNNConv, pyg_nn.HeteroConv)


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
    """
    new = _convert_one(model, '', strict)
    if new is not None:
        return new
    _convert_children(model, '', strict)
    return model


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
    if cls in _TWINS:
        if _twin_keeps_state(module):
            return _rebuild(module, _TWINS[cls])
        # A state the twin's constructor cannot recreate (DirGNNConv turns
        # root_weight off after lin_r exists): the stock forward, adapted.
        _convert_children(module, f'{path}.' if path else '', strict)
        return adapt(module)
    if cls in NORM_CONVERTERS:
        return NORM_CONVERTERS[cls](module)
    if cls in NORMALIZED or cls in ADAPTED:
        _convert_children(module, f'{path}.' if path else '', strict)
        return adapt(module)
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
            not isinstance(module, MessagePassing) and cls not in
            _CONV_CLASSES else 'has no distributed version in pyg_sar')
    if cls.__name__ in REFUSAL_REASONS:
        what += ' (' + REFUSAL_REASONS[cls.__name__] + ')'
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


def _twin_keeps_state(module: torch.nn.Module) -> bool:
    if isinstance(module, pyg_nn.GINConv):
        return True  # its constructor would reset the shared nn
    with torch.device('meta'):
        twin = _TWINS[type(module)](module)
    return set(twin.state_dict()) == set(module.state_dict())


def _rebuild(module: torch.nn.Module, make: Callable) -> torch.nn.Module:
    # Snapshot first: constructors reset parameters of shared submodules
    # (GINConv's nn).
    state = {k: v.clone() for k, v in module.state_dict().items()}
    flags = {k: p.requires_grad for k, p in module.named_parameters()}
    param = next(module.parameters(), None)
    new = make(module)
    if isinstance(module, pyg_nn.GINConv):
        to_distributed(module.nn)
    if param is not None:
        new = new.to(device=param.device, dtype=param.dtype)
    new.load_state_dict(state, strict=True)
    for name, p in new.named_parameters():
        p.requires_grad_(flags.get(name, p.requires_grad))
    new.train(module.training)
    return new
