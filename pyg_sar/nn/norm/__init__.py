"""Node-mixing normalizations with whole-graph statistics.

Each module equals its PyG/torch twin applied to the whole graph on one
machine, while every worker holds only the rows of its own nodes. The
statistics are summed over ranks with :func:`pyg_sar.comm.global_sum`, so
forward *and* backward are collectives in training mode (and, without
running statistics, in eval mode too).
"""
import inspect
import itertools
from typing import Callable, Dict

import torch
import torch_geometric.nn as pyg_nn

from pyg_sar.nn.norm.batch_norm import BatchNorm
from pyg_sar.nn.norm.batch_norm_1d import BatchNorm1d
from pyg_sar.nn.norm.graph_norm import GraphNorm
from pyg_sar.nn.norm.instance_norm import InstanceNorm
from pyg_sar.nn.norm.layer_norm import LayerNorm
from pyg_sar.nn.norm.pair_norm import PairNorm

__all__ = [
    'BatchNorm', 'BatchNorm1d', 'GraphNorm', 'InstanceNorm', 'LayerNorm',
    'PairNorm',
]


def _twin(stock: torch.nn.Module, new: torch.nn.Module) -> torch.nn.Module:
    """Gives ``new`` the dtype, device, ``requires_grad`` and values of every
    parameter and buffer of ``stock``, and its training mode."""
    tensors = itertools.chain(stock.named_parameters(),
                              stock.named_buffers())
    for name, src in tensors:
        owner_name, _, attr = name.rpartition('.')
        owner = new.get_submodule(owner_name)
        dst = getattr(owner, attr)
        if isinstance(dst, torch.nn.Parameter):
            dst.data = dst.data.to(device=src.device, dtype=src.dtype)
            dst.requires_grad_(src.requires_grad)
        else:
            setattr(owner, attr, dst.to(device=src.device, dtype=src.dtype))
    new.load_state_dict(stock.state_dict(), strict=True)
    return new.train(stock.training)


def _batch_norm(m: pyg_nn.BatchNorm) -> BatchNorm:
    bn = m.module
    return _twin(m, BatchNorm(m.in_channels, bn.eps, bn.momentum, bn.affine,
                              bn.track_running_stats, m.allow_single_element))


# torch < 2.12 has no ``bias`` argument (and always learns a bias with
# ``affine``).
_BN_HAS_BIAS = 'bias' in inspect.signature(torch.nn.BatchNorm1d).parameters


def _batch_norm_1d(m: torch.nn.BatchNorm1d) -> BatchNorm1d:
    bias = ({'bias': m.bias is not None or not m.affine} if _BN_HAS_BIAS
            else {})
    return _twin(m, BatchNorm1d(m.num_features, m.eps, m.momentum, m.affine,
                                m.track_running_stats, **bias))


def _instance_norm(m: pyg_nn.InstanceNorm) -> InstanceNorm:
    return _twin(m, InstanceNorm(m.num_features, m.eps, m.momentum, m.affine,
                                 m.track_running_stats))


# Stock class -> builds its distributed twin (same constructor arguments,
# state_dict loaded strictly; dtype, device, requires_grad and training
# mode preserved).
NORM_CONVERTERS: Dict[type, Callable[[torch.nn.Module], torch.nn.Module]] = {
    pyg_nn.BatchNorm: _batch_norm,
    torch.nn.BatchNorm1d: _batch_norm_1d,
    pyg_nn.LayerNorm: lambda m: _twin(m, LayerNorm(
        m.in_channels, m.eps, m.affine, m.mode)),
    pyg_nn.GraphNorm: lambda m: _twin(m, GraphNorm(m.in_channels, m.eps)),
    pyg_nn.InstanceNorm: _instance_norm,
    pyg_nn.PairNorm: lambda m: _twin(m, PairNorm(
        m.scale, m.scale_individually, m.eps)),
}

# Modules that mix node rows (their output for one node depends on other
# nodes) and have no distributed twin: on a distributed graph they would
# silently use per-worker statistics. Not listed, because per-node:
# MessageNorm, HeteroLayerNorm (mode='node' only), torch.nn.LayerNorm,
# GroupNorm, InstanceNorm1d/2d/3d, LocalResponseNorm on [N, C, ...] rows.
# Not listed, because it becomes exact once its children are converted:
# DiffGroupNorm (per-node softmax and sum around an inner BatchNorm1d
# on [N, G * C] rows).
NODE_MIXING_WITHOUT_DIST_VERSION = (
    pyg_nn.MeanSubtractionNorm,  # subtracts the mean over all nodes
    pyg_nn.GraphSizeNorm,  # divides by sqrt(number of nodes of the graph)
    pyg_nn.HeteroBatchNorm,  # per-type statistics over all nodes
    torch.nn.BatchNorm2d,  # statistics over dim 0 (the nodes) ...
    torch.nn.BatchNorm3d,
    torch.nn.SyncBatchNorm,  # ... all-reduced outside pyg_sar.comm, GPU only
    torch.nn.LazyBatchNorm1d,  # becomes BatchNorm1d after its first call
    torch.nn.LazyBatchNorm2d,
    torch.nn.LazyBatchNorm3d,
)
