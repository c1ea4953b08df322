from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
import torch_geometric.nn as pyg_nn
from torch.nn.modules.instancenorm import _InstanceNorm

from pyg_sar.nn.plain import in_plain_call
from pyg_sar.nn.norm._stats import (DIST_BATCH_ERROR, global_moments,
                                    normalize,
                                    update_running_stats)


class InstanceNorm(_InstanceNorm):
    r"""Instance normalization of a graph whose nodes are split across
    workers (distributed :class:`torch_geometric.nn.InstanceNorm`).

    .. math::
        \mathbf{x}^{\prime}_i = \frac{\mathbf{x} -
        \textrm{E}[\mathbf{x}]}{\sqrt{\textrm{Var}[\mathbf{x}] + \epsilon}}
        \odot \gamma + \beta

    The mean and biased variance are per channel over all nodes of the
    whole graph (the single instance; all workers). As in PyG (which calls
    :func:`torch.nn.functional.instance_norm` for ``batch=None``), training
    with ``track_running_stats`` folds the mean and the *unbiased* variance
    into the running statistics with weight ``momentum`` (no cumulative
    average: ``momentum`` must be a float, and ``num_batches_tracked`` is
    not advanced), and eval mode then normalizes with them.

    Args:
        in_channels (int): Size of each input sample.
        eps (float, optional): A value added to the denominator for numerical
            stability. (default: :obj:`1e-5`)
        momentum (float, optional): The value used for the running mean and
            running variance computation. (default: :obj:`0.1`)
        affine (bool, optional): If set to :obj:`True`, this module has
            learnable affine parameters :math:`\gamma` and :math:`\beta`.
            (default: :obj:`False`)
        track_running_stats (bool, optional): If set to :obj:`True`, this
            module tracks the running mean and variance, and when set to
            :obj:`False`, this module does not track such statistics and always
            uses instance statistics in both training and eval modes.
            (default: :obj:`False`)
        device (torch.device, optional): The device to use for the module.
            (default: :obj:`None`)
    """

    def __init__(
        self,
        in_channels: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        device: Optional[torch.device] = None,
    ) -> None:
        super().__init__(in_channels, eps, momentum, affine,
                         track_running_stats, device=device)

    def reset_parameters(self) -> None:
        r"""Resets all learnable parameters of the module."""
        super().reset_parameters()

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                batch_size: Optional[int] = None) -> Tensor:
        r"""Normalizes the local node rows ``x`` ``[N_local, C]`` (a
        collective unless in eval mode with running statistics); ``batch``
        must be :obj:`None`."""
        if in_plain_call():  # a sampled batch: its own statistics
            return pyg_nn.InstanceNorm.forward(self, x, batch, batch_size)
        if batch is not None:
            raise ValueError(DIST_BATCH_ERROR.format(name='InstanceNorm'))
        if self.momentum is None:  # so does F.instance_norm in PyG's forward
            raise TypeError("InstanceNorm: 'momentum' must be a float "
                            "(got None)")
        if not (self.training or not self.track_running_stats):
            return F.batch_norm(x, self.running_mean, self.running_var,
                                self.weight, self.bias, False, 0.0, self.eps)

        mean, var, count = global_moments(x)
        if count <= 1:
            raise ValueError(f"Expected more than 1 spatial element when "
                             f"training, got {count} node(s) over all "
                             f"workers")
        if self.running_mean is not None and self.running_var is not None:
            update_running_stats(self.running_mean, self.running_var, mean,
                                 var, count, self.momentum)

        return normalize(x, mean, var, self.eps, self.weight, self.bias)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({self.num_features})'
