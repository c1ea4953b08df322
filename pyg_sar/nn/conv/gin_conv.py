from typing import Callable, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.nn.inits import reset

from pyg_sar.graph import DistGraph
from pyg_sar.nn.message_passing import DistMessagePassing


class GINConv(DistMessagePassing):
    r"""The graph isomorphism operator from the `"How Powerful are Graph
    Neural Networks?" <https://arxiv.org/abs/1810.00826>`_ paper, over a
    :class:`~pyg_sar.DistGraph`.

    .. math::
        \mathbf{x}^{\prime}_i = h_{\mathbf{\Theta}} \left( (1 + \epsilon) \cdot
        \mathbf{x}_i + \sum_{j \in \mathcal{N}(i)} \mathbf{x}_j \right)

    Same constructor, parameters and ``state_dict`` as
    :class:`torch_geometric.nn.GINConv`.
    """
    linear_message = True

    def __init__(self, nn: Callable, eps: float = 0., train_eps: bool = False,
                 **kwargs) -> None:
        kwargs.setdefault('aggr', 'add')
        super().__init__(**kwargs)
        self.nn = nn
        self.initial_eps = eps
        if train_eps:
            self.eps = torch.nn.Parameter(torch.empty(1))
        else:
            self.register_buffer('eps', torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        reset(self.nn)
        self.eps.data.fill_(self.initial_eps)

    def forward(self, x: Union[Tensor, Tuple[Tensor, Tensor]],
                graph: DistGraph) -> Tensor:
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        out = self.propagate(graph, x=x_src)
        return self.nn(out + (1 + self.eps) * x_dst)

    def message(self, x_j: Tensor) -> Tensor:
        return x_j

    def message_weight(self):
        return None

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(nn={self.nn})'
