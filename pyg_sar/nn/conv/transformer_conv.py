import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.nn.dense.linear import Linear

from pyg_sar.graph import DistGraph
from pyg_sar.nn.conv.rgat_conv import check_no_attention_weights
from pyg_sar.nn.engine.spec import FusedScore
from pyg_sar.nn.message_passing import DistMessagePassing


class TransformerConv(DistMessagePassing):
    r"""The graph transformer operator from the `"Masked Label Prediction:
    Unified Message Passing Model for Semi-Supervised Classification"
    <https://arxiv.org/abs/2009.03509>`_ paper, over a
    :class:`~pyg_sar.DistGraph`.

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i +
        \sum_{j \in \mathcal{N}(i)} \alpha_{i,j} \left(\mathbf{W}_2
        \mathbf{x}_{j} [+ \mathbf{W}_6 \mathbf{e}_{ij}]\right),
        \qquad
        \alpha_{i,j} = \textrm{softmax}_j \left(
        \frac{(\mathbf{W}_3\mathbf{x}_i)^{\top} (\mathbf{W}_4\mathbf{x}_j
        [+ \mathbf{W}_6 \mathbf{e}_{ij}])} {\sqrt{d}} \right)

    per head, heads concatenated or averaged. With ``beta``, the root term
    is gated: :math:`\mathbf{x}^{\prime}_i = \beta_i \mathbf{W}_1
    \mathbf{x}_i + (1 - \beta_i) \mathbf{m}_i` with :math:`\beta_i =
    \textrm{sigmoid}(\mathbf{w}_5^{\top} [\mathbf{W}_1 \mathbf{x}_i,
    \mathbf{m}_i, \mathbf{W}_1 \mathbf{x}_i - \mathbf{m}_i])` and
    :math:`\mathbf{m}_i` the aggregate.

    The softmax runs over all in-edges of :math:`i` across workers, online
    (the engine's attention, :mod:`pyg_sar.nn.engine.attention`): only a
    running max and sum per node and head are kept, never the ``[E, heads]``
    attention matrix; scores (and the edge term :math:`\mathbf{W}_6
    \mathbf{e}_{ij}`) are recomputed chunk by chunk in backward. Without
    ``edge_dim`` the scores, softmax and weighted sum of each chunk run in
    one fused kernel (:mod:`pyg_sar.nn.engine.fused`; C++ on CPU, Triton on
    CUDA); with it the edge term enters the values too, and the chunk runs
    as separate operators.
    Attention dropout replays its mask in backward (its random numbers are
    not a single process's, as for every dropout). ``return_attention_weights``
    is refused over a ``DistGraph`` (the attention of each edge is not
    kept). Same constructor, parameters and ``state_dict`` as
    :class:`torch_geometric.nn.TransformerConv`; with a plain
    ``edge_index`` it is PyG's layer.

    Args:
        in_channels (int or tuple): Size of each input sample, or ``-1``
            for lazy initialization; a tuple gives the sizes of source and
            destination features.
        out_channels (int): Size of each output sample (per head).
        heads (int, optional): Number of attention heads. (default: ``1``)
        concat (bool, optional): If ``False``, the heads are averaged
            instead of concatenated. (default: ``True``)
        beta (bool, optional): Gate the root term as above.
            (default: ``False``)
        dropout (float, optional): Dropout probability of the normalized
            attention coefficients. (default: ``0``)
        edge_dim (int, optional): Edge feature dimensionality; the
            transformed edge features are added to the keys and the values.
            (default: ``None``)
        bias (bool, optional): Learn additive biases in the projections.
            (default: ``True``)
        root_weight (bool, optional): If ``False``, no root term is added
            (and ``beta`` is off). (default: ``True``)
        **kwargs (optional): Additional arguments of
            :class:`pyg_sar.nn.DistMessagePassing` (``aggr`` must stay
            ``'add'``).

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}^{(p)}|, F_{in})` of
          the local nodes or a pair :math:`((|\mathcal{V}^{(p)}|, F_{s}),
          (|\mathcal{V}^{(p)}|, F_{t}))`, the graph, optional edge features
          :math:`(|\mathcal{E}^{(p)}|, D)` in the graph's edge order (e.g.
          ``part.edge_attr``)
        - **output:** node features :math:`(|\mathcal{V}^{(p)}|,
          H \cdot F_{out})`, or :math:`(|\mathcal{V}^{(p)}|, F_{out})` when
          ``concat=False``
    """
    attention = True
    message_is_identity = True  # message(value_j, None) is value_j
    message_parameters = ('lin_edge.weight', )

    def __init__(self, in_channels: Union[int, Tuple[int, int]],
                 out_channels: int, heads: int = 1, concat: bool = True,
                 beta: bool = False, dropout: float = 0.,
                 edge_dim: Optional[int] = None, bias: bool = True,
                 root_weight: bool = True, **kwargs) -> None:
        kwargs.setdefault('aggr', 'add')
        if kwargs['aggr'] not in ('add', 'sum'):
            raise ValueError(f"TransformerConv: aggr={kwargs['aggr']!r} is "
                             f"not supported by pyg_sar.nn.TransformerConv "
                             f"(its attention sums); use aggr='add'")
        super().__init__(node_dim=0, **kwargs)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.beta = beta and root_weight
        self.root_weight = root_weight
        self.concat = concat
        self.dropout = dropout
        self.edge_dim = edge_dim
        in_src, in_dst = ((in_channels, in_channels)
                          if isinstance(in_channels, int) else in_channels)
        self.lin_key = Linear(in_src, heads * out_channels, bias=bias)
        self.lin_query = Linear(in_dst, heads * out_channels, bias=bias)
        self.lin_value = Linear(in_src, heads * out_channels, bias=bias)
        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, heads * out_channels, bias=False)
        else:
            self.register_parameter('lin_edge', None)
        width = heads * out_channels if concat else out_channels
        self.lin_skip = Linear(in_dst, width, bias=bias)
        if self.beta:
            self.lin_beta = Linear(3 * width, 1, bias=False)
        else:
            self.register_parameter('lin_beta', None)
        self.reset_parameters()

    @property
    def attention_dropout(self) -> float:
        return self.dropout

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.lin_key.reset_parameters()
        self.lin_query.reset_parameters()
        self.lin_value.reset_parameters()
        if self.edge_dim:
            self.lin_edge.reset_parameters()
        self.lin_skip.reset_parameters()
        if self.beta:
            self.lin_beta.reset_parameters()

    def forward(self, x: Union[Tensor, Tuple[Tensor, Tensor]],
                edge_index: DistGraph, edge_attr: Optional[Tensor] = None,
                return_attention_weights: Optional[bool] = None) -> Tensor:
        check_no_attention_weights(self, return_attention_weights)
        H, C = self.heads, self.out_channels
        if isinstance(x, Tensor):
            x = (x, x)
        if self.lin_edge is not None:
            if edge_attr is None or edge_attr.dim() != 2:
                raise ValueError(
                    f"TransformerConv(edge_dim={self.edge_dim}) needs "
                    f"edge_attr of shape [num_edges, {self.edge_dim}] in "
                    f"the graph's edge order (got "
                    f"{None if edge_attr is None else tuple(edge_attr.shape)})")
        query = self.lin_query(x[1]).view(-1, H, C)
        key = self.lin_key(x[0]).view(-1, H, C)
        value = self.lin_value(x[0]).view(-1, H, C)
        out = self.propagate(edge_index, query=query, key=key, value=value,
                             edge_attr=edge_attr)
        if self.concat:
            out = out.view(-1, H * C)
        else:
            out = out.mean(dim=1)
        if self.root_weight:
            x_r = self.lin_skip(x[1])
            if self.lin_beta is not None:
                beta = self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1))
                beta = beta.sigmoid()
                out = beta * x_r + (1 - beta) * out
            else:
                out = out + x_r
        return out

    def edge_score(self, query_i: Tensor, key_j: Tensor,
                   edge_attr: Optional[Tensor]) -> Tensor:
        if self.lin_edge is not None:
            key_j = key_j + self._edge_term(edge_attr)
        return (query_i * key_j).sum(dim=-1) / math.sqrt(self.out_channels)

    def message(self, value_j: Tensor, edge_attr: Optional[Tensor]) -> Tensor:
        if edge_attr is None:
            return value_j
        if self.lin_edge is not None:
            edge_attr = self._edge_term(edge_attr)
        return value_j + edge_attr

    def fused_score(self) -> Optional[FusedScore]:
        """The score as the fused kernels compute it
        (:mod:`pyg_sar.nn.engine.kernels`): ``key_j . query_i /
        sqrt(out_channels)``. With ``edge_dim`` the edge term enters the
        values too, which the kernels do not add: not fused."""
        if self.lin_edge is not None:
            return None
        return FusedScore('dot', 'key', math.sqrt(self.out_channels),
                          score_dst='query')

    def fused_edge_term(self, edge_attr: Tensor) -> Optional[Tensor]:
        """No edge term in the fused score (see :meth:`fused_score`)."""
        return None

    def _edge_term(self, edge_attr: Tensor) -> Tensor:
        """:math:`\\mathbf{W}_6 \\mathbf{e}_{ij}` of a chunk's edges,
        ``[E, heads, out_channels]`` (recomputed per chunk, never held for
        all edges)."""
        return self.lin_edge(edge_attr).view(-1, self.heads,
                                             self.out_channels)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, '
                f'{self.out_channels}, heads={self.heads})')
