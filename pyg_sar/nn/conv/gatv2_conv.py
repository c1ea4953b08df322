from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import glorot, zeros

from pyg_sar.graph import DistGraph
from pyg_sar.nn.engine.spec import FusedScore
from pyg_sar.nn.conv.gat_conv import combine_heads, loop_view
from pyg_sar.nn.message_passing import DistMessagePassing


class GATv2Conv(DistMessagePassing):
    r"""The GATv2 operator from the `"How Attentive are Graph Attention
    Networks?" <https://arxiv.org/abs/2105.14491>`_ paper, over a
    :class:`~pyg_sar.DistGraph`.

    .. math::
        \mathbf{x}^{\prime}_i = \sum_{j \in \mathcal{N}(i) \cup \{ i \}}
        \alpha_{i,j}\mathbf{\Theta}_{s}\mathbf{x}_{j},
        \qquad
        \alpha_{i,j} = \mathrm{softmax}_j \left( \mathbf{a}^{\top}
        \mathrm{LeakyReLU}\left(\mathbf{\Theta}_{s} \mathbf{x}_j +
        \mathbf{\Theta}_{t} \mathbf{x}_{i} [+ \mathbf{\Theta}_{e}
        \mathbf{e}_{j,i}] \right) \right)

    The score is recomputed per block in the backward pass, so its
    parameters ``att`` (and ``lin_edge``) get their gradients from the
    rematerialization. Same constructor, parameters and ``state_dict`` as
    :class:`torch_geometric.nn.GATv2Conv`.
    """
    attention = True
    message_is_identity = True
    message_parameters = ('att', 'lin_edge.weight')

    def __init__(self, in_channels: Union[int, Tuple[int, int]],
                 out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, dropout: float = 0.0,
                 add_self_loops: bool = True, edge_dim: Optional[int] = None,
                 fill_value: Union[float, Tensor, str] = 'mean',
                 bias: bool = True, share_weights: bool = False,
                 residual: bool = False, **kwargs) -> None:
        super().__init__(node_dim=0, **kwargs)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.concat = concat
        self.negative_slope = negative_slope
        self.dropout = dropout
        self.add_self_loops = add_self_loops
        self.edge_dim = edge_dim
        self.fill_value = fill_value
        self.residual = residual
        self.share_weights = share_weights
        in_src, in_dst = ((in_channels, in_channels)
                          if isinstance(in_channels, int) else in_channels)
        self.lin_l = Linear(in_src, heads * out_channels, bias=bias,
                            weight_initializer='glorot')
        if share_weights:
            self.lin_r = self.lin_l
        else:
            self.lin_r = Linear(in_dst, heads * out_channels, bias=bias,
                                weight_initializer='glorot')
        self.att = Parameter(torch.empty(1, heads, out_channels))
        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, heads * out_channels, bias=False,
                                   weight_initializer='glorot')
        else:
            self.lin_edge = None
        total_out_channels = out_channels * (heads if concat else 1)
        if residual:
            self.res = Linear(in_dst, total_out_channels, bias=False,
                              weight_initializer='glorot')
        else:
            self.register_parameter('res', None)
        if bias:
            self.bias = Parameter(torch.empty(total_out_channels))
        else:
            self.register_parameter('bias', None)
        self.reset_parameters()

    @property
    def attention_dropout(self) -> float:
        return self.dropout

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.lin_l.reset_parameters()
        self.lin_r.reset_parameters()
        if self.lin_edge is not None:
            self.lin_edge.reset_parameters()
        if self.res is not None:
            self.res.reset_parameters()
        glorot(self.att)
        zeros(self.bias)

    def forward(self, x: Union[Tensor, Tuple[Tensor, Tensor]],
                graph: DistGraph,
                edge_attr: Optional[Tensor] = None) -> Tensor:
        H, C = self.heads, self.out_channels
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        res = self.res(x_dst) if self.res is not None else None
        x_l = self.lin_l(x_src).view(-1, H, C)
        x_r = x_l if self.share_weights and x_dst is x_src else \
            self.lin_r(x_dst).view(-1, H, C)
        if self.add_self_loops:
            graph, edge_attr = loop_view(graph, edge_attr, self.fill_value)
        out = self.propagate(graph, x=(x_l, x_r), edge_attr=edge_attr)
        return combine_heads(out, self.concat, res, self.bias)

    def edge_score(self, x_j: Tensor, x_i: Tensor,
                   edge_attr: Optional[Tensor]) -> Tensor:
        x = x_i + x_j
        if edge_attr is not None:
            x = x + self._edge_features(edge_attr)
        x = F.leaky_relu(x, self.negative_slope)
        return (x * self.att).sum(dim=-1)

    def message(self, x_j: Tensor) -> Tensor:
        return x_j

    def fused_score(self) -> FusedScore:
        """The score as the fused kernels compute it
        (:mod:`pyg_sar.nn.engine.kernels`): ``att . lrelu(x_j + x_i +
        edge term)``."""
        return FusedScore('gatv2', 'x', self.negative_slope, att=self.att,
                          edge='edge_attr')

    def fused_edge_term(self, edge_attr: Tensor) -> Optional[Tensor]:
        """The edge term of the score, ``[E, heads, out_channels]``."""
        return self._edge_features(edge_attr)

    def _edge_features(self, edge_attr: Tensor) -> Tensor:
        # As PyG: edge features without edge_dim fail in lin_edge (None).
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        return self.lin_edge(edge_attr).view(-1, self.heads,
                                             self.out_channels)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, '
                f'{self.out_channels}, heads={self.heads})')
