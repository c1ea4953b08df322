"""Swap the convolutions of a stock PyG model for distributed ones."""
from typing import Callable, Dict, Type

import torch
import torch_geometric.nn as pyg_nn

from pyg_sar.nn.batch_norm import BatchNorm
from pyg_sar.nn.gat_conv import GATConv
from pyg_sar.nn.gatv2_conv import GATv2Conv
from pyg_sar.nn.gcn_conv import GCNConv
from pyg_sar.nn.gin_conv import GINConv
from pyg_sar.nn.graph_conv import GraphConv
from pyg_sar.nn.sage_conv import SAGEConv


def _aggr(module) -> Dict:
    return {'aggr': module.aggr}


def _gat_args(m) -> Dict:
    return dict(in_channels=m.in_channels, out_channels=m.out_channels,
                heads=m.heads, concat=m.concat,
                negative_slope=m.negative_slope, dropout=m.dropout,
                add_self_loops=m.add_self_loops, edge_dim=m.edge_dim,
                fill_value=m.fill_value, bias=m.bias is not None,
                residual=m.residual)


# How to rebuild each supported PyG module with its own constructor args.
_CONVERTERS: Dict[Type, Callable] = {
    pyg_nn.SAGEConv: lambda m: SAGEConv(
        m.in_channels, m.out_channels, normalize=m.normalize,
        root_weight=m.root_weight, project=m.project,
        bias=m.lin_l.bias is not None, **_aggr(m)),
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
    pyg_nn.GATv2Conv: lambda m: GATv2Conv(
        **_gat_args(m), share_weights=m.share_weights),
    pyg_nn.BatchNorm: lambda m: BatchNorm(
        m.in_channels, m.module.eps, m.module.momentum, m.module.affine,
        m.module.track_running_stats, m.allow_single_element),
}


def to_distributed(model: torch.nn.Module) -> torch.nn.Module:
    """Replaces, in place, every supported PyG layer of ``model``
    (``GCNConv``, ``SAGEConv``, ``GraphConv``, ``GINConv``, ``GATConv``,
    ``GATv2Conv``, ``BatchNorm``) by its :mod:`pyg_sar.nn` twin, weights
    included, and returns the model.

    The model's ``forward`` must hand its second argument (``edge_index``)
    through to the convolutions: ``model(x, graph)`` then runs distributed
    with a :class:`pyg_sar.DistGraph`. The state_dict keys do not change, so
    the converted model's weights load back into the stock PyG model.
    """
    if type(model) in _CONVERTERS:
        return _convert(model)
    for name, child in list(model.named_children()):
        if type(child) in _CONVERTERS:
            setattr(model, name, _convert(child))
        else:
            to_distributed(child)
    return model


def _convert(module: torch.nn.Module) -> torch.nn.Module:
    # Snapshot first: constructors reset parameters of shared submodules
    # (GINConv's nn).
    state = {k: v.clone() for k, v in module.state_dict().items()}
    new = _CONVERTERS[type(module)](module)
    if isinstance(module, pyg_nn.GINConv):
        to_distributed(module.nn)
    new.load_state_dict(state, strict=True)
    new.train(module.training)
    param = next(module.parameters(), None)
    if param is not None:
        new = new.to(param.device)
    return new
