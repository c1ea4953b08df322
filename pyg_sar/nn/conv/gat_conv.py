from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import glorot, zeros

from pyg_sar.graph import DistGraph
from pyg_sar.nn.engine.spec import FusedScore
from pyg_sar.nn.functional import head_scores
from pyg_sar.nn.message_passing import DistMessagePassing


class GATConv(DistMessagePassing):
    r"""The graph attentional operator from the `"Graph Attention Networks"
    <https://arxiv.org/abs/1710.10903>`_ paper, over a
    :class:`~pyg_sar.DistGraph`.

    .. math::
        \mathbf{x}^{\prime}_i = \sum_{j \in \mathcal{N}(i) \cup \{ i \}}
        \alpha_{i,j}\mathbf{\Theta}_{s}\mathbf{x}_{j},
        \qquad
        \alpha_{i,j} = \mathrm{softmax}_j \left( \mathrm{LeakyReLU} \left(
        \mathbf{a}^{\top}_{s} \mathbf{\Theta}_{s}\mathbf{x}_j +
        \mathbf{a}^{\top}_{t} \mathbf{\Theta}_{t}\mathbf{x}_i
        [+ \mathbf{a}^{\top}_{e} \mathbf{\Theta}_{e} \mathbf{e}_{j,i}]
        \right)\right)

    The softmax runs over all in-edges of :math:`i` across workers, online:
    only a running max and sum per node and head are kept, never the
    ``[E, heads]`` attention matrix. Same constructor, parameters and
    ``state_dict`` as :class:`torch_geometric.nn.GATConv` (self loops are
    replaced as PyG replaces them; ``edge_attr`` is in graph edge order).
    """
    attention = True
    message_is_identity = True
    message_parameters = ('att_edge', 'lin_edge.weight')

    def __init__(self, in_channels: Union[int, Tuple[int, int]],
                 out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, dropout: float = 0.0,
                 add_self_loops: bool = True, edge_dim: Optional[int] = None,
                 fill_value: Union[float, Tensor, str] = 'mean',
                 bias: bool = True, residual: bool = False, **kwargs) -> None:
        kwargs.setdefault('aggr', 'add')
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
        self.lin = self.lin_src = self.lin_dst = None
        if isinstance(in_channels, int):
            self.lin = Linear(in_channels, heads * out_channels, bias=False,
                              weight_initializer='glorot')
        else:
            self.lin_src = Linear(in_channels[0], heads * out_channels, False,
                                  weight_initializer='glorot')
            self.lin_dst = Linear(in_channels[1], heads * out_channels, False,
                                  weight_initializer='glorot')
        self.att_src = Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = Parameter(torch.empty(1, heads, out_channels))
        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, heads * out_channels, bias=False,
                                   weight_initializer='glorot')
            self.att_edge = Parameter(torch.empty(1, heads, out_channels))
        else:
            self.lin_edge = None
            self.register_parameter('att_edge', None)
        total_out_channels = out_channels * (heads if concat else 1)
        if residual:
            self.res = Linear(
                in_channels if isinstance(in_channels, int) else
                in_channels[1], total_out_channels, bias=False,
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
        for lin in (self.lin, self.lin_src, self.lin_dst, self.lin_edge,
                    self.res):
            if lin is not None:
                lin.reset_parameters()
        glorot(self.att_src)
        glorot(self.att_dst)
        glorot(self.att_edge)
        zeros(self.bias)

    def forward(self, x: Union[Tensor, Tuple[Tensor, Tensor]],
                graph: DistGraph,
                edge_attr: Optional[Tensor] = None) -> Tensor:
        H, C = self.heads, self.out_channels
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        res = self.res(x_dst) if self.res is not None else None
        if self.lin is not None:
            h_src = self.lin(x_src).view(-1, H, C)
            h_dst = h_src if x_dst is x_src else self.lin(x_dst).view(-1, H, C)
        else:
            h_src = self.lin_src(x_src).view(-1, H, C)
            h_dst = self.lin_dst(x_dst).view(-1, H, C)
        if h_dst is h_src:
            alpha_src, alpha_dst = head_scores(h_src, self.att_src,
                                               self.att_dst)
        else:
            alpha_src, = head_scores(h_src, self.att_src)
            alpha_dst, = head_scores(h_dst, self.att_dst)
        if self.add_self_loops:
            graph, edge_attr = loop_view(graph, edge_attr, self.fill_value)
        out = self.propagate(graph, x=h_src, alpha=(alpha_src, alpha_dst),
                             edge_attr=edge_attr)
        return combine_heads(out, self.concat, res, self.bias)

    def edge_score(self, alpha_j: Tensor, alpha_i: Tensor,
                   edge_attr: Optional[Tensor]) -> Tensor:
        alpha = alpha_j + alpha_i
        if edge_attr is not None and self.lin_edge is not None:
            alpha = alpha + self.fused_edge_term(edge_attr)
        return F.leaky_relu(alpha, self.negative_slope)

    def message(self, x_j: Tensor) -> Tensor:
        return x_j

    def fused_score(self) -> FusedScore:
        """The score as the fused kernels compute it
        (:mod:`pyg_sar.nn.engine.kernels`): ``lrelu(alpha_j + alpha_i +
        edge term)``."""
        return FusedScore('gat', 'alpha', self.negative_slope,
                          edge='edge_attr')

    def fused_edge_term(self, edge_attr: Tensor) -> Optional[Tensor]:
        """The edge term of the score, ``[E, heads]``, from the edges'
        attributes (``None`` without ``edge_dim``)."""
        if self.lin_edge is None:
            return None
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        edge_attr = self.lin_edge(edge_attr).view(-1, self.heads,
                                                  self.out_channels)
        return head_scores(edge_attr, self.att_edge)[0]

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, '
                f'{self.out_channels}, heads={self.heads})')


def combine_heads(out: Tensor, concat: bool, res: Optional[Tensor],
                  bias: Optional[Tensor]) -> Tensor:
    """``[N, H, C]`` attention output to PyG's layout: heads concatenated
    or averaged, then the residual and the bias added."""
    out = out.flatten(1) if concat else out.mean(dim=1)
    if res is not None:
        out = out + res
    if bias is not None:
        out = out + bias
    return out


def loop_view(graph: DistGraph, edge_attr: Optional[Tensor],
              fill_value) -> Tuple[DistGraph, Optional[Tensor]]:
    """PyG's ``remove_self_loops`` + ``add_self_loops`` on a DistGraph: every
    node gets exactly one self loop (all local); loop edge attributes are
    ``fill_value``, or with ``'mean'`` the mean of the node's other in-edge
    attributes, as PyG computes them."""
    view = graph.with_self_loops()
    if edge_attr is None:
        return view, None
    if isinstance(fill_value, str):
        if fill_value not in ('mean', 'add', 'sum', 'max', 'min', 'mul'):
            raise ValueError(f"fill_value={fill_value!r} is not supported")
        from torch_geometric.utils import scatter
        kept = view.kept_base_edges()
        kept_attr = edge_attr[kept]
        dst = graph.edge_dst()[kept]
        reduce = 'sum' if fill_value == 'add' else fill_value
        loop_attr = scatter(kept_attr, dst, 0, view.num_nodes, reduce)
        return view, torch.cat([kept_attr, loop_attr])
    return view, view.expand_edge_values(edge_attr, fill_value)
