r"""PyG's :class:`~torch_geometric.nn.conv.EGConv` over a
:class:`~pyg_sar.DistGraph`.

.. math::
    \mathbf{x}_i^{\prime} = {\LARGE ||}_{h=1}^H \sum_{\oplus \in
    \mathcal{A}} \sum_{b = 1}^B w_{i, h, \oplus, b} \;
    \underset{j \in \mathcal{N}(i) \cup \{i\}}{\bigoplus}
    \mathbf{W}_b \mathbf{x}_{j}

with aggregators :math:`\oplus` among ``sum``, ``mean``, ``min``, ``max``,
``var``, ``std`` and ``symnorm``, the symmetric GCN normalization
:math:`\sum_j \mathbf{W}_b \mathbf{x}_j / \sqrt{\hat{d}_j \hat{d}_i}`.
Every aggregator is over the in-edges of one destination, so it runs over
whole neighborhoods (:mod:`pyg_sar.nn.neighborhood`); ``symnorm`` takes the
degrees :math:`\hat{d}_j` of halo sources from their owners
(:func:`pyg_sar.nn.gcn_norm.gcn_norm`). Without ``symnorm`` PyG adds self
loops with ``add_remaining_self_loops(edge_index)``, which infers the node
count from the largest id on an edge: the same count is agreed over the
workers, so nodes above it get no loop, as in PyG.
"""
from typing import Optional

import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor

from pyg_sar.graph import DistGraph
from pyg_sar.nn.adapter import DistAdapter, register_adapted
from pyg_sar.nn.conv._dist_edges import inferred_num_nodes, run_edges
from pyg_sar.nn.gcn_norm import gcn_norm
from pyg_sar.nn.neighborhood import whole_propagate
from pyg_sar.nn.zoo_extra import register_switch


class EGConv(DistAdapter, pyg_nn.EGConv):
    r"""The Efficient Graph Convolution from the `"Adaptive Filters and
    Aggregator Fusion for Efficient Graph Convolutions"
    <https://arxiv.org/abs/2104.01481>`_ paper, over a
    :class:`~pyg_sar.DistGraph` (formula in the module docs). Same
    constructor, parameters and ``state_dict`` as
    :class:`torch_geometric.nn.EGConv`; with a plain ``edge_index`` it is
    PyG's layer.

    Args:
        in_channels (int): Size of each input sample.
        out_channels (int): Size of each output sample.
        aggregators (List[str], optional): Aggregators (default
            ``['symnorm']``).
        num_heads (int, optional): Number of heads :math:`H`.
        num_bases (int, optional): Number of basis weights :math:`B`.
        cached (bool, optional): PyG's cache of the normalized edges; over a
            ``DistGraph`` the normalization is recomputed every call.
        add_self_loops (bool, optional): Add self loops.
        bias (bool, optional): Learn an additive bias.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}^{(p)}|, F_{in})` of
          the local nodes, the graph
        - **output:** :math:`(|\mathcal{V}^{(p)}|, F_{out})`
    """

    def forward(self, x: Tensor, edge_index) -> Tensor:
        if not isinstance(edge_index, DistGraph):
            return super().forward(x, edge_index)
        graph, ei, _ = run_edges(self, edge_index, device=x.device)
        symnorm_weight: Optional[Tensor] = None
        if 'symnorm' in self.aggregators:
            ei, symnorm_weight = gcn_norm(graph, ei, None, False,
                                          self.add_self_loops, self.flow,
                                          x.dtype)
        elif self.add_self_loops:
            ei = self._remaining_self_loops(graph, ei)

        bases = self.bases_lin(x)
        weightings = self.comb_lin(x)
        aggregated = whole_propagate(
            self, graph, ei, dict(x=bases, symnorm_weight=symnorm_weight))

        weightings = weightings.view(-1, self.num_heads,
                                     self.num_bases * len(self.aggregators))
        aggregated = aggregated.view(-1,
                                     len(self.aggregators) * self.num_bases,
                                     self.out_channels // self.num_heads)
        out = torch.matmul(weightings, aggregated).view(-1, self.out_channels)
        if self.bias is not None:
            out = out + self.bias
        return out

    @staticmethod
    def _remaining_self_loops(graph: DistGraph, ei: Tensor) -> Tensor:
        """PyG's ``add_remaining_self_loops(edge_index)``: every self loop
        removed, one appended for each local node below the inferred node
        count."""
        num_nodes = inferred_num_nodes(graph, ei)
        ids = graph.orig_ids
        local = torch.arange(graph.num_nodes, device=ei.device)
        if ids is not None:
            local = local[ids.to(ei.device) < num_nodes]
        else:
            local = local[local + graph.node_offset < num_nodes]
        keep = ei[0] != ei[1]
        return torch.cat([ei[:, keep], local.view(1, -1).repeat(2, 1)], 1)


register_adapted(pyg_nn.EGConv, EGConv)
register_switch(pyg_nn.EGConv, EGConv)
