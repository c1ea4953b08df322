"""``RGCNConv`` and ``FastRGCNConv``: relational graph convolution over a
:class:`~pyg_sar.DistGraph` of a homogeneous partition of
``HeteroData.to_homogeneous()``."""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.nn.inits import glorot, zeros

from pyg_sar.graph import DistGraph
from pyg_sar.nn.message_passing import DistMessagePassing
from pyg_sar.graph.relation_view import relation_view


class RGCNConv(DistMessagePassing):
    r"""The relational graph convolutional operator from the `"Modeling
    Relational Data with Graph Convolutional Networks"
    <https://arxiv.org/abs/1703.06103>`_ paper, over a
    :class:`~pyg_sar.DistGraph`.

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{\Theta}_{\textrm{root}} \cdot
        \mathbf{x}_i + \sum_{r \in \mathcal{R}} \sum_{j \in \mathcal{N}_r(i)}
        \frac{1}{|\mathcal{N}_r(i)|} \mathbf{\Theta}_r \cdot \mathbf{x}_j

    (with ``aggr="mean"``; ``"sum"``, ``"max"`` and ``"min"`` aggregate
    each relation accordingly). Same constructor, parameters and
    ``state_dict`` as :class:`torch_geometric.nn.RGCNConv`, basis and
    block-diagonal decompositions included.

    All relations are aggregated in one propagation over the graph's
    relation-expanded view (:mod:`pyg_sar.graph.relation_view`): one halo
    exchange per layer, whatever the number of relations.

    Args:
        in_channels (int or tuple): Size of each input sample (for
            featureless nodes: the number of nodes, whose ids index the
            trainable embeddings).
        out_channels (int): Size of each output sample.
        num_relations (int): Number of relations.
        num_bases (int, optional): Number of bases (basis-decomposition).
        num_blocks (int, optional): Number of blocks (block-diagonal
            decomposition).
        aggr (str, optional): ``"mean"``, ``"sum"``/``"add"``, ``"max"`` or
            ``"min"``. (default: ``"mean"``)
        root_weight (bool, optional): Add the transformed root node
            features. (default: ``True``)
        is_sorted (bool, optional): Accepted for compatibility; the view is
            sorted by relation already.
        bias (bool, optional): Learn an additive bias. (default: ``True``)

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}^{(p)}|, F_{in})` of
          the local nodes, or a node index tensor
          :math:`(|\mathcal{V}^{(p)}|)` (input-graph ids of the local nodes;
          ``None`` uses ``graph.orig_ids``), the graph, and ``edge_type``
          :math:`(|\mathcal{E}^{(p)}|)` in the graph's edge order (e.g.
          ``part.edge_type``)
        - **output:** node features :math:`(|\mathcal{V}^{(p)}|, F_{out})`
    """
    linear_message = True

    def __init__(self, in_channels: Union[int, Tuple[int, int]],
                 out_channels: int, num_relations: int,
                 num_bases: Optional[int] = None,
                 num_blocks: Optional[int] = None, aggr: str = 'mean',
                 root_weight: bool = True, is_sorted: bool = False,
                 bias: bool = True, **kwargs) -> None:
        kwargs.setdefault('aggr', aggr)
        super().__init__(node_dim=0, **kwargs)
        if num_bases is not None and num_blocks is not None:
            raise ValueError('Can not apply both basis-decomposition and '
                             'block-diagonal-decomposition at the same time.')
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.num_relations = num_relations
        self.num_bases = num_bases
        self.num_blocks = num_blocks
        self.is_sorted = is_sorted
        if isinstance(in_channels, int):
            in_channels = (in_channels, in_channels)
        self.in_channels_l = in_channels[0]
        if num_bases is not None:
            self.weight = Parameter(
                torch.empty(num_bases, in_channels[0], out_channels))
            self.comp = Parameter(torch.empty(num_relations, num_bases))
        elif num_blocks is not None:
            if in_channels[0] % num_blocks or out_channels % num_blocks:
                raise ValueError(f"num_blocks={num_blocks} must divide "
                                 f"in_channels={in_channels[0]} and "
                                 f"out_channels={out_channels}")
            self.weight = Parameter(
                torch.empty(num_relations, num_blocks,
                            in_channels[0] // num_blocks,
                            out_channels // num_blocks))
            self.register_parameter('comp', None)
        else:
            self.weight = Parameter(
                torch.empty(num_relations, in_channels[0], out_channels))
            self.register_parameter('comp', None)
        if root_weight:
            self.root = Parameter(torch.empty(in_channels[1], out_channels))
        else:
            self.register_parameter('root', None)
        if bias:
            self.bias = Parameter(torch.empty(out_channels))
        else:
            self.register_parameter('bias', None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        glorot(self.weight)
        glorot(self.comp)
        glorot(self.root)
        zeros(self.bias)

    def relation_weights(self) -> Tensor:
        """:math:`\\mathbf{\\Theta}_r` for every relation (bases combined)."""
        if self.num_bases is None:
            return self.weight
        return (self.comp @ self.weight.view(self.num_bases, -1)).view(
            self.num_relations, self.in_channels_l, self.out_channels)

    def forward(self, x: Union[Optional[Tensor], Tuple[Optional[Tensor],
                                                       Tensor]],
                graph: DistGraph, edge_type: Tensor) -> Tensor:
        x_l = x[0] if isinstance(x, tuple) else x
        if x_l is None:
            x_l = _local_ids(self, graph)
        x_r = x[1] if isinstance(x, tuple) else x_l
        # Layer-wise MFGs: the relation view's rows of D_k (graph/mfg.py).
        view = relation_view(graph, edge_type, self.num_relations,
                             type(self).__name__)
        N, R, C = graph.num_nodes, self.num_relations, self.out_channels
        weight = self.relation_weights()
        if not torch.is_floating_point(x_l):
            if self.num_blocks is not None:
                raise ValueError('Block-diagonal decomposition not supported '
                                 'for non-continuous input features.')
            # Trainable embeddings: every relation's row of each source.
            table = weight[:, x_l].transpose(0, 1).reshape(-1, R * C)
            h = self.propagate(view, x=table, edge_select=edge_type)
            out = h.view(N, R, C).sum(dim=1)
        else:
            h = self.propagate(view, x=x_l)
            h = h.view(N, R, h.shape[-1])
            if self.num_blocks is not None:
                B = self.num_blocks
                h = h.view(N, R, B, h.shape[-1] // B)
                out = torch.einsum('nrbi,rbio->nbo', h, weight).reshape(N, C)
            else:
                out = torch.einsum('nri,rio->no', h, weight)
        if self.root is not None:
            if not torch.is_floating_point(x_r):
                out = out + self.root[x_r]
            else:
                out = out + x_r @ self.root
        if self.bias is not None:
            out = out + self.bias
        return out

    def message(self, x_j: Tensor,
                edge_select: Optional[Tensor] = None) -> Tensor:
        if edge_select is None:
            return x_j
        # Embedding rows: keep the edge's own relation.
        rows = x_j.view(x_j.shape[0], self.num_relations, -1)
        index = edge_select.view(-1, 1, 1).expand(-1, 1, rows.shape[-1])
        return rows.gather(1, index).squeeze(1)

    def message_weight(self, edge_select: Optional[Tensor] = None):
        return None if edge_select is None else NotImplemented

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, '
                f'{self.out_channels}, num_relations={self.num_relations})')


class FastRGCNConv(RGCNConv):
    r"""PyG's :class:`torch_geometric.nn.FastRGCNConv` over a
    :class:`~pyg_sar.DistGraph`: the same operator as :class:`RGCNConv`
    (``aggr`` ``"mean"`` or ``"sum"``/``"add"``), so it runs the same
    one-exchange computation; same constructor and ``state_dict``."""

    def forward(self, x, graph: DistGraph, edge_type: Tensor) -> Tensor:
        if self.aggr not in ('add', 'sum', 'mean'):
            raise ValueError(f"FastRGCNConv supports aggr 'add', 'sum' or "
                             f"'mean' (got {self.aggr!r})")
        return super().forward(x, graph, edge_type)


def _local_ids(module, graph: DistGraph) -> Tensor:
    """Featureless input: the input-graph ids of the local nodes, which
    index the embeddings as PyG's ``arange(in_channels)`` does."""
    ids = getattr(graph, 'orig_ids', None)
    if ids is None:
        raise ValueError(f"{type(module).__name__}: x=None needs the input "
                         f"ids of the local nodes (graph.orig_ids), which "
                         f"this graph does not have; pass them as x")
    return ids.to(graph.device)
