from typing import Optional

import torch
from torch import Tensor
import torch_geometric.nn as pyg_nn

from pyg_sar.nn.plain import in_plain_call
from pyg_sar.nn.norm._stats import DIST_BATCH_ERROR, global_mean


class PairNorm(torch.nn.Module):
    r"""Pair normalization over a graph whose nodes are split across workers
    (distributed :class:`torch_geometric.nn.PairNorm`).

    .. math::
        \mathbf{x}_i^c &= \mathbf{x}_i - \frac{1}{n}
        \sum_{i=1}^n \mathbf{x}_i \\

        \mathbf{x}_i^{\prime} &= s \cdot
        \frac{\mathbf{x}_i^c}{\sqrt{\frac{1}{n} \sum_{i=1}^n
        {\| \mathbf{x}_i^c \|}^2_2}}

    where the sums run over all :math:`n` nodes of the whole graph (all
    workers).

    Args:
        scale (float, optional): Scaling factor :math:`s` of normalization.
            (default, :obj:`1.`)
        scale_individually (bool, optional): If set to :obj:`True`, will
            compute the scaling step as :math:`\mathbf{x}^{\prime}_i = s \cdot
            \frac{\mathbf{x}_i^c}{{\| \mathbf{x}_i^c \|}_2}`.
            (default: :obj:`False`)
        eps (float, optional): A value added to the denominator for numerical
            stability. (default: :obj:`1e-5`)
    """

    def __init__(self, scale: float = 1., scale_individually: bool = False,
                 eps: float = 1e-5) -> None:
        super().__init__()
        self.scale = scale
        self.scale_individually = scale_individually
        self.eps = eps

    def reset_parameters(self) -> None:
        r"""No learnable parameters."""

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                batch_size: Optional[int] = None) -> Tensor:
        r"""Normalizes the local node rows ``x`` ``[N_local, C]`` (a
        collective); ``batch`` must be :obj:`None`."""
        if in_plain_call():  # a sampled batch: its own statistics
            return pyg_nn.PairNorm.forward(self, x, batch, batch_size)
        if batch is not None:
            raise ValueError(DIST_BATCH_ERROR.format(name='PairNorm'))
        mean, _ = global_mean(x)
        x = x - mean
        if not self.scale_individually:
            mean_sq_norm, _ = global_mean(x.pow(2).sum(-1, keepdim=True))
            return self.scale * x / (self.eps + mean_sq_norm).sqrt()
        return self.scale * x / (self.eps + x.norm(2, -1, keepdim=True))

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}()'
