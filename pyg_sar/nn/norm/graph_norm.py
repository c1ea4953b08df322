from typing import Optional

import torch
from torch import Tensor
import torch_geometric.nn as pyg_nn

from pyg_sar.nn.plain import in_plain_call
from pyg_sar.nn.norm._stats import DIST_BATCH_ERROR, global_mean


class GraphNorm(torch.nn.Module):
    r"""Graph normalization over a graph whose nodes are split across
    workers (distributed :class:`torch_geometric.nn.GraphNorm`).

    .. math::
        \mathbf{x}^{\prime}_i = \frac{\mathbf{x} - \alpha \odot
        \textrm{E}[\mathbf{x}]}
        {\sqrt{\textrm{Var}[\mathbf{x} - \alpha \odot \textrm{E}[\mathbf{x}]]
        + \epsilon}} \odot \gamma + \beta

    where :math:`\alpha` denotes parameters that learn how much information
    to keep in the mean, and :math:`\textrm{E}`, :math:`\textrm{Var}` run
    per channel over all nodes of the whole graph (all workers).

    Args:
        in_channels (int): Size of each input sample.
        eps (float, optional): A value added to the denominator for numerical
            stability. (default: :obj:`1e-5`)
        device (torch.device, optional): The device to use for the module.
            (default: :obj:`None`)
    """

    def __init__(self, in_channels: int, eps: float = 1e-5,
                 device: Optional[torch.device] = None) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.eps = eps
        self.weight = torch.nn.Parameter(
            torch.empty(in_channels, device=device))
        self.bias = torch.nn.Parameter(torch.empty(in_channels, device=device))
        self.mean_scale = torch.nn.Parameter(
            torch.empty(in_channels, device=device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        r"""Resets all learnable parameters of the module."""
        torch.nn.init.ones_(self.weight)
        torch.nn.init.zeros_(self.bias)
        torch.nn.init.ones_(self.mean_scale)

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                batch_size: Optional[int] = None) -> Tensor:
        r"""Normalizes the local node rows ``x`` ``[N_local, C]`` (a
        collective); ``batch`` must be :obj:`None`."""
        if in_plain_call():  # a sampled batch: its own statistics
            return pyg_nn.GraphNorm.forward(self, x, batch, batch_size)
        if batch is not None:
            raise ValueError(DIST_BATCH_ERROR.format(name='GraphNorm'))
        mean, _ = global_mean(x)
        out = x - mean * self.mean_scale
        var, _ = global_mean(out.pow(2))
        std = (var + self.eps).sqrt()
        return self.weight * out / std + self.bias

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({self.in_channels})'
