from typing import Optional

import torch
from torch import Tensor
import torch_geometric.nn as pyg_nn

from pyg_sar.nn.plain import in_plain_call
from pyg_sar.nn.norm.batch_norm_1d import BatchNorm1d, global_batch_norm


class BatchNorm(torch.nn.Module):
    r"""Batch normalization over all nodes of all workers (distributed
    :class:`torch_geometric.nn.BatchNorm`).

    .. math::
        \mathbf{x}^{\prime}_i = \frac{\mathbf{x}_i -
        \textrm{E}[\mathbf{x}]}{\sqrt{\textrm{Var}[\mathbf{x}] + \epsilon}}
        \odot \gamma + \beta

    The mean and (biased) variance are per channel over all nodes of the
    whole graph, computed in two passes (global mean, then global sum of
    squared deviations), so a distributed model normalizes exactly as PyG's
    ``BatchNorm`` does on one machine. Same constructor and ``state_dict``
    (``module.weight``, ``module.bias``, ``module.running_mean``, ...) as
    PyG's.

    Args:
        in_channels (int): Size of each input sample.
        eps (float, optional): A value added to the denominator for numerical
            stability. (default: :obj:`1e-5`)
        momentum (float, optional): The value used for the running mean and
            running variance computation; :obj:`None` for a cumulative
            average. (default: :obj:`0.1`)
        affine (bool, optional): If set to :obj:`True`, this module has
            learnable affine parameters :math:`\gamma` and :math:`\beta`.
            (default: :obj:`True`)
        track_running_stats (bool, optional): If set to :obj:`True`, this
            module tracks the running mean and variance, and when set to
            :obj:`False`, this module does not track such statistics and
            always uses whole-graph statistics in both training and eval
            modes. (default: :obj:`True`)
        allow_single_element (bool, optional): If set to :obj:`True`, a graph
            with a single node (over all workers) is normalized as in
            evaluation, with the running mean and variance.
            Requires :obj:`track_running_stats=True`. (default: :obj:`False`)
        device (torch.device, optional): The device to use for the module.
            (default: :obj:`None`)
    """

    def __init__(
        self,
        in_channels: int,
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        allow_single_element: bool = False,
        device: Optional[torch.device] = None,
    ) -> None:
        super().__init__()
        if allow_single_element and not track_running_stats:
            raise ValueError("'allow_single_element' requires "
                             "'track_running_stats' to be set to `True`")
        self.module = BatchNorm1d(in_channels, eps, momentum, affine,
                                  track_running_stats, device=device)
        self.in_channels = in_channels
        self.allow_single_element = allow_single_element

    def reset_running_stats(self) -> None:
        r"""Resets all running statistics of the module."""
        self.module.reset_running_stats()

    def reset_parameters(self) -> None:
        r"""Resets all learnable parameters of the module."""
        self.module.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        r"""Normalizes the local node rows ``x`` ``[N_local, C]`` (a
        collective in training mode)."""
        if in_plain_call():  # a sampled batch: its own statistics
            return pyg_nn.BatchNorm.forward(self, x)
        return global_batch_norm(x, self.module, self.allow_single_element)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({self.module.extra_repr()})'
