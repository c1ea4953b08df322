from typing import Optional

import torch
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import zeros

from pyg_sar.graph import DistGraph
from pyg_sar.nn.message_passing import DistMessagePassing


class GCNConv(DistMessagePassing):
    r"""The graph convolutional operator from the `"Semi-supervised
    Classification with Graph Convolutional Networks"
    <https://arxiv.org/abs/1609.02907>`_ paper, over a
    :class:`~pyg_sar.DistGraph`.

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{\Theta}^{\top} \sum_{j \in
        \mathcal{N}(i) \cup \{ i \}} \frac{e_{j,i}}{\sqrt{\hat{d}_j
        \hat{d}_i}} \mathbf{x}_j

    with :math:`\hat{d}_i = 1 + \sum_{j \in \mathcal{N}(i)} e_{j,i}`. A
    node's in-edges all live with its owner, so :math:`\hat{d}_i` is local;
    the source-side :math:`\hat{d}_j` of remote sources is fetched once per
    graph (or per call with learnable-free ``edge_weight``). Same constructor,
    parameters and ``state_dict`` as :class:`torch_geometric.nn.GCNConv`.
    ``cached=True`` keeps the normalization of the first call.
    """
    linear_message = True

    def __init__(self, in_channels: int, out_channels: int,
                 improved: bool = False, cached: bool = False,
                 add_self_loops: Optional[bool] = None, normalize: bool = True,
                 bias: bool = True, **kwargs) -> None:
        kwargs.setdefault('aggr', 'add')
        super().__init__(**kwargs)
        if add_self_loops is None:
            add_self_loops = normalize
        if add_self_loops and not normalize:
            raise ValueError(f"'{self.__class__.__name__}' does not support "
                             f"adding self-loops to the graph when no "
                             f"on-the-fly normalization is applied")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.improved = improved
        self.cached = cached
        self.add_self_loops = add_self_loops
        self.normalize = normalize
        self._cached = None
        self.lin = Linear(in_channels, out_channels, bias=False,
                          weight_initializer='glorot')
        if bias:
            self.bias = Parameter(torch.empty(out_channels))
        else:
            self.register_parameter('bias', None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.lin.reset_parameters()
        zeros(self.bias)
        self._cached = None

    def forward(self, x: Tensor, graph: DistGraph,
                edge_weight: Optional[Tensor] = None) -> Tensor:
        if isinstance(x, (tuple, list)):
            raise ValueError(f"'{self.__class__.__name__}' does not support "
                             f"bipartite message passing")
        if self.normalize:
            if self._cached is not None and self._cached[0] is graph:
                graph, edge_weight = self._cached[1], self._cached[2]
            else:
                base = graph
                key = ('gcn_norm', self.improved, self.add_self_loops, x.dtype)
                if edge_weight is None and key in graph.derived:
                    graph, edge_weight = graph.derived[key]
                else:
                    plain = edge_weight is None
                    graph, edge_weight = self.gcn_norm(graph, edge_weight,
                                                       x.dtype)
                    if plain:  # depends on the graph alone: reuse it
                        base.derived[key] = (graph, edge_weight)
                if self.cached:
                    self._cached = (base, graph, edge_weight)
        out = self.propagate(graph, x=self.lin(x), edge_weight=edge_weight)
        if self.bias is not None:
            out = out + self.bias
        return out

    def gcn_norm(self, graph: DistGraph, edge_weight: Optional[Tensor],
                 dtype: torch.dtype):
        """Symmetric normalization :math:`e_{j,i} / \\sqrt{\\hat{d}_j
        \\hat{d}_i}` of every edge, self loops added as PyG's ``gcn_norm``
        adds them (existing loops keep their weight)."""
        fill = 2. if self.improved else 1.
        if edge_weight is not None and edge_weight.requires_grad:
            raise ValueError(
                f"'{self.__class__.__name__}' over a DistGraph does not "
                f"support learnable edge weights (their gradient would flow "
                f"through remote degrees); use GraphConv, or pass "
                f"edge_weight.detach()")
        if edge_weight is None:
            edge_weight = torch.ones(graph.num_edges, dtype=dtype,
                                     device=graph.device)
        if self.add_self_loops:
            edge_weight = graph.with_self_loops().expand_edge_values(
                edge_weight, fill, keep_existing_loops=True)
            graph = graph.with_self_loops()
        deg = edge_weight.new_zeros(graph.num_nodes)
        dst_of_edge = torch.empty(graph.num_edges, dtype=torch.long,
                                  device=graph.device)
        src_deg = edge_weight.new_empty(graph.num_edges)
        for block in graph.blocks:
            dst_of_edge[block.edge_pos] = block.dst.long()
        deg.index_add_(0, dst_of_edge, edge_weight)
        deg_inv_sqrt = deg.pow(-0.5)
        deg_inv_sqrt.masked_fill_(deg_inv_sqrt == float('inf'), 0)
        for block, values in zip(graph.blocks,
                                 graph.source_values(deg_inv_sqrt)):
            src_deg[block.edge_pos] = values[block.src]
        norm = src_deg * edge_weight * deg_inv_sqrt[dst_of_edge]
        return graph, norm

    def message(self, x_j: Tensor, edge_weight: Optional[Tensor]) -> Tensor:
        return x_j if edge_weight is None else edge_weight.view(-1, 1) * x_j

    def message_weight(self, edge_weight: Optional[Tensor]):
        return edge_weight
