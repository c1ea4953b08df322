from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
import torch_geometric.nn as pyg_nn
from torch.nn import Parameter

from pyg_sar.nn.plain import in_plain_call
from pyg_sar.nn.norm._stats import DIST_BATCH_ERROR, global_mean


class LayerNorm(torch.nn.Module):
    r"""Layer normalization over a graph whose nodes are split across
    workers (distributed :class:`torch_geometric.nn.LayerNorm`).

    .. math::
        \mathbf{x}^{\prime}_i = \frac{\mathbf{x} -
        \textrm{E}[\mathbf{x}]}{\sqrt{\textrm{Var}[\mathbf{x}] + \epsilon}}
        \odot \gamma + \beta

    In :obj:`"graph"` mode the mean and standard deviation run over all
    nodes (of all workers) and all channels of the whole graph; as in PyG,
    :math:`\epsilon` is added to the (biased) standard deviation:
    :math:`(\mathbf{x} - \mu) / (\sigma + \epsilon)`. In :obj:`"node"` mode
    every node is normalized over its own channels (no communication).

    Args:
        in_channels (int): Size of each input sample.
        eps (float, optional): A value added to the denominator for numerical
            stability. (default: :obj:`1e-5`)
        affine (bool, optional): If set to :obj:`True`, this module has
            learnable affine parameters :math:`\gamma` and :math:`\beta`.
            (default: :obj:`True`)
        mode (str, optional): The normalization mode to use for layer
            normalization (:obj:`"graph"` or :obj:`"node"`).
            (default: :obj:`"graph"`)
        device (torch.device, optional): The device to use for the module.
            (default: :obj:`None`)
    """

    def __init__(
        self,
        in_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        mode: str = 'graph',
        device: Optional[torch.device] = None,
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.eps = eps
        self.affine = affine
        self.mode = mode
        if affine:
            self.weight = Parameter(torch.empty(in_channels, device=device))
            self.bias = Parameter(torch.empty(in_channels, device=device))
        else:
            self.register_parameter('weight', None)
            self.register_parameter('bias', None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        r"""Resets all learnable parameters of the module."""
        if self.affine:
            torch.nn.init.ones_(self.weight)
            torch.nn.init.zeros_(self.bias)

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                batch_size: Optional[int] = None) -> Tensor:
        r"""Normalizes the local node rows ``x`` ``[N_local, C]``; in
        ``"graph"`` mode a collective, and ``batch`` must be :obj:`None`
        (the whole graph is one example)."""
        if in_plain_call():  # a sampled batch: its own statistics
            return pyg_nn.LayerNorm.forward(self, x, batch, batch_size)
        if self.mode == 'graph':
            if batch is not None:
                raise ValueError(DIST_BATCH_ERROR.format(name='LayerNorm'))
            # Mean and variance over every entry of the whole graph: the
            # global mean over rows of the flattened [N * C, 1] tensor.
            mean, _ = global_mean(x.reshape(-1, 1))
            x = x - mean
            var, _ = global_mean(x.pow(2).reshape(-1, 1))
            out = x / (var.sqrt() + self.eps)
            if self.weight is not None and self.bias is not None:
                out = out * self.weight + self.bias
            return out

        if self.mode == 'node':
            return F.layer_norm(x, (self.in_channels, ), self.weight,
                                self.bias, self.eps)

        raise ValueError(f"Unknown normalization mode: {self.mode}")

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, '
                f'affine={self.affine}, mode={self.mode})')
