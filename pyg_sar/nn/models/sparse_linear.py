r"""The first layer of PyG's :class:`~torch_geometric.nn.models.LINKX`
(``SparseLinear``) over a :class:`~pyg_sar.DistGraph`.

.. math::
    \mathbf{h}_i = \sum_{j \in \mathcal{N}(i)} e_{j,i} \cdot
    \mathbf{W}_j + \mathbf{b}

a linear map of each node's adjacency row: :math:`\mathbf{W}` has one
trainable row per node of the *whole* graph, indexed by the node's id in
the input graph. Every worker keeps the whole :math:`\mathbf{W}` (as the
stock model does, replicated like every other parameter) and sums the rows
of the sources of its local in-edges, halo sources by their input-graph ids
(fetched once per call from their owners). The gradient of :math:`\mathbf{W}`
on each worker holds the rows its edges read; summed over the workers
(:func:`pyg_sar.all_reduce_grads`) it is the single-process gradient.
"""
from typing import Optional

import torch
from torch import Tensor
from torch_geometric.nn.models.linkx import SparseLinear as StockSparseLinear
from torch_geometric.utils import scatter

from pyg_sar.graph import DistGraph
from pyg_sar.nn.zoo_extra import register_switch


class SparseLinear(StockSparseLinear):
    r"""LINKX's linear map of adjacency rows over a
    :class:`~pyg_sar.DistGraph` (see the module docs). Same constructor and
    state as PyG's ``SparseLinear``; with a plain ``edge_index`` it is
    PyG's. Collective over a ``DistGraph``.

    Args:
        in_channels (int): The number of nodes of the whole graph (rows of
            :math:`\mathbf{W}`).
        out_channels (int): The size of each output sample.
        bias (bool, optional): Whether to learn an additive bias.
            (default: ``True``)

    Shapes:
        - **input:** the graph, optional ``edge_weight``
          :math:`(|\mathcal{E}^{(p)}|)` (the partition's local edges)
        - **output:** :math:`(|\mathcal{V}^{(p)}|, F_{out})`
    """

    # Called with a DistGraph by design (pyg_sar/utils/layer_guard.py).
    accepts_dist_graph = True

    def forward(self, edge_index, edge_weight: Optional[Tensor] = None
                ) -> Tensor:
        if not isinstance(edge_index, DistGraph):
            return super().forward(edge_index, edge_weight)
        graph = edge_index
        if graph.is_bipartite:
            raise ValueError("LINKX's SparseLinear over a DistGraph: a "
                             "bipartite relation graph is not supported")
        if self.in_channels != graph.num_global_nodes:
            raise ValueError(
                f"LINKX over a DistGraph: num_nodes={self.in_channels} but "
                f"the graph has {graph.num_global_nodes} nodes; LINKX needs "
                f"num_nodes equal to the number of nodes of the whole graph")
        device = self.weight.device
        ids = graph.orig_ids
        if ids is None:
            ids = torch.arange(graph.node_offset,
                               graph.node_offset + graph.num_nodes)
        ids = graph.fetch_halo(ids.to(device))  # input-graph ids, with halo
        ei = graph.halo_edge_index().to(device)
        rows = self.weight[ids[ei[0]]]
        if edge_weight is not None:
            rows = rows * edge_weight.view(-1, 1).to(rows.dtype)
        out = scatter(rows, ei[1], 0, dim_size=graph.num_nodes, reduce='sum')
        if self.bias is not None:
            out = out + self.bias
        return out


register_switch(StockSparseLinear, SparseLinear)
