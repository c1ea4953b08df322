import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from pyg_sar.nn.plain import in_plain_call
from pyg_sar.nn.norm._stats import (global_moments, normalize,
                                    update_running_stats)


def global_batch_norm(x: Tensor, bn: _BatchNorm,
                      allow_single_element: bool = False) -> Tensor:
    r"""Batch normalization of node rows ``x`` ``[N_local, C]`` with the
    statistics of all nodes of all ranks, using the parameters, buffers and
    flags of ``bn`` (a :class:`torch.nn.BatchNorm1d`) exactly as
    :meth:`torch.nn.BatchNorm1d.forward` does:

    * training, or no running statistics: normalize with the whole-graph
      mean and biased variance; in training with ``track_running_stats``
      fold the mean and *unbiased* variance into the running statistics
      (``momentum=None``: cumulative average over ``num_batches_tracked``);
    * eval with running statistics: normalize with them (no communication).

    ``allow_single_element`` is PyG's :class:`~torch_geometric.nn.BatchNorm`
    flag: when the whole graph has at most one node, the running
    statistics are used instead (and not updated).
    """
    if not (bn.training or bn.running_mean is None):
        return _normalize_with_running_stats(x, bn)
    if x.dim() != 2:
        raise ValueError(f"{type(bn).__name__}: distributed batch norm "
                         f"expects node rows [N, C] (got shape "
                         f"{tuple(x.shape)})")
    mean, var, count = global_moments(x)
    if allow_single_element and count <= 1:
        return _normalize_with_running_stats(x, bn)

    update = bn.training and bn.track_running_stats
    momentum = 0.0 if bn.momentum is None else bn.momentum
    if update and bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
        if bn.momentum is None:  # cumulative moving average
            momentum = 1.0 / float(bn.num_batches_tracked)
    if count == 1:
        raise ValueError(f"Expected more than 1 value per channel when "
                         f"training, got 1 node over all workers (local "
                         f"input size {tuple(x.shape)})")
    if count == 0:  # no node anywhere: torch returns an empty result
        return F.batch_norm(x, None, None, bn.weight, bn.bias, True, 0.0,
                            bn.eps)
    if update:
        update_running_stats(bn.running_mean, bn.running_var, mean, var,
                             count, momentum)

    return normalize(x, mean, var, bn.eps, bn.weight, bn.bias)


def _normalize_with_running_stats(x: Tensor, bn: _BatchNorm) -> Tensor:
    return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight,
                        bn.bias, False, 0.0, bn.eps)


class BatchNorm1d(torch.nn.BatchNorm1d):
    r""":class:`torch.nn.BatchNorm1d` over the node rows of all workers.

    .. math::
        \mathbf{x}^{\prime}_i = \frac{\mathbf{x}_i -
        \textrm{E}[\mathbf{x}]}{\sqrt{\textrm{Var}[\mathbf{x}] + \epsilon}}
        \odot \gamma + \beta

    where :math:`\textrm{E}` and :math:`\textrm{Var}` (biased) run over
    all nodes of the whole graph, so a distributed model normalizes exactly
    as a plain ``BatchNorm1d`` applied to ``x`` ``[N, C]`` of the whole graph
    does on one machine. Drop-in replacement for the ``BatchNorm1d`` inside
    MLPs of, e.g., ``GINConv``: same constructor, parameters and
    ``state_dict`` (``weight``, ``bias``, ``running_mean``, ``running_var``,
    ``num_batches_tracked``). Inputs must be 2-D ``[N_local, C]``.

    Args:
        num_features (int): Number of channels :math:`C`.
        eps (float, optional): Added to the variance for numerical
            stability. (default: :obj:`1e-5`)
        momentum (float, optional): Weight of the current statistics in the
            running ones; :obj:`None` for a cumulative average.
            (default: :obj:`0.1`)
        affine (bool, optional): Learn :math:`\gamma` and :math:`\beta`.
            (default: :obj:`True`)
        track_running_stats (bool, optional): Track running statistics and
            use them in eval mode; if :obj:`False`, always use the
            whole-graph statistics. (default: :obj:`True`)
        device (torch.device, optional): Device of the parameters.
        dtype (torch.dtype, optional): Dtype of the parameters.
        bias (bool, optional, keyword-only): With ``affine``, learn
            :math:`\beta` too. (default: :obj:`True`)
    """

    def forward(self, x: Tensor) -> Tensor:
        if in_plain_call():  # a sampled batch: its own statistics
            return torch.nn.BatchNorm1d.forward(self, x)
        return global_batch_norm(x, self)
