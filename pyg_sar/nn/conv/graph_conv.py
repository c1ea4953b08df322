from typing import Optional, Tuple, Union

from torch import Tensor
from torch_geometric.nn.dense.linear import Linear

from pyg_sar.graph import DistGraph
from pyg_sar.nn.message_passing import DistMessagePassing, linear_of_aggregate


class GraphConv(DistMessagePassing):
    r"""The graph neural network operator from the `"Weisfeiler and Leman Go
    Neural: Higher-order Graph Neural Networks"
    <https://arxiv.org/abs/1810.02244>`_ paper, over a
    :class:`~pyg_sar.DistGraph`.

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i + \mathbf{W}_2
        \bigoplus_{j \in \mathcal{N}(i)} e_{j,i} \cdot \mathbf{x}_j

    Same constructor, parameters and ``state_dict`` as
    :class:`torch_geometric.nn.GraphConv`. ``edge_weight`` holds
    :math:`e_{j,i}` in the graph's edge order (e.g. ``part.edge_weight``).
    """
    linear_message = True

    def __init__(self, in_channels: Union[int, Tuple[int, int]],
                 out_channels: int, aggr: str = 'add', bias: bool = True,
                 **kwargs) -> None:
        super().__init__(aggr=aggr, **kwargs)
        self.in_channels = in_channels
        self.out_channels = out_channels
        if isinstance(in_channels, int):
            in_channels = (in_channels, in_channels)
        self.lin_rel = Linear(in_channels[0], out_channels, bias=bias)
        self.lin_root = Linear(in_channels[1], out_channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.lin_rel.reset_parameters()
        self.lin_root.reset_parameters()

    def forward(self, x: Union[Tensor, Tuple[Tensor, Tensor]],
                graph: DistGraph,
                edge_weight: Optional[Tensor] = None) -> Tensor:
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        # lin_rel keeps no aggregate for backward where it can be
        # recomputed (inputs that need no gradient).
        out = linear_of_aggregate(self.lin_rel, lambda: self.propagate(
            graph, x=x_src, edge_weight=edge_weight), (x_src, edge_weight))
        return out + self.lin_root(x_dst)

    def message(self, x_j: Tensor, edge_weight: Optional[Tensor]) -> Tensor:
        return x_j if edge_weight is None else edge_weight.view(-1, 1) * x_j

    def message_weight(self, edge_weight: Optional[Tensor]):
        if edge_weight is not None and edge_weight.requires_grad:
            return NotImplemented
        return edge_weight
