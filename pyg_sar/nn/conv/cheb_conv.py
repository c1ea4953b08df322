r"""PyG's :class:`~torch_geometric.nn.conv.ChebConv` over a
:class:`~pyg_sar.DistGraph`.

.. math::
    \mathbf{X}^{\prime} = \sum_{k=1}^{K} \mathbf{Z}^{(k)} \cdot
    \mathbf{\Theta}^{(k)}, \quad \mathbf{Z}^{(1)} = \mathbf{X}, \quad
    \mathbf{Z}^{(2)} = \mathbf{\hat{L}} \mathbf{X}, \quad
    \mathbf{Z}^{(k)} = 2 \mathbf{\hat{L}} \mathbf{Z}^{(k-1)} -
    \mathbf{Z}^{(k-2)}

with :math:`\mathbf{\hat{L}} = 2\mathbf{L} / \lambda_{\max} - \mathbf{I}`.
PyG's Laplacian takes the degree of the *source* of every edge (its
out-degree): a worker holds only the in-edges of its nodes, so the partial
out-degrees it sees are summed at the owners (:meth:`DistGraph.push_halo`)
and fetched back with the halo; :math:`\lambda_{\max}` defaults to twice the
largest Laplacian weight of the whole graph (a global maximum).
"""
from typing import Optional

import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.utils import add_self_loops, remove_self_loops, scatter

from pyg_sar import comm
from pyg_sar.nn.adapter import DistAdapter, register_adapted


class ChebConv(DistAdapter, pyg_nn.ChebConv):
    """Same constructor, parameters and ``state_dict`` as PyG's
    ``ChebConv``; ``forward(x, graph, edge_weight=None, batch=None,
    lambda_max=None)`` with a :class:`~pyg_sar.DistGraph` (with a plain
    ``edge_index`` it is PyG's)."""

    def __norm__(self, edge_index: Tensor, num_nodes: Optional[int],
                 edge_weight: Optional[Tensor], normalization: Optional[str],
                 lambda_max=None, dtype=None, batch=None):
        graph = self._sar_graph
        if graph is None:
            return super().__norm__(edge_index, num_nodes, edge_weight,
                                    normalization, lambda_max, dtype, batch)
        if batch is not None:
            raise ValueError("ChebConv over a DistGraph: a per-graph 'batch' "
                             "is not supported (one graph spans the workers)")
        edge_index, edge_weight = self.laplacian(edge_index, edge_weight,
                                                 normalization, dtype)
        if lambda_max is None:
            if edge_weight.requires_grad:
                raise ValueError(
                    "ChebConv over a DistGraph needs lambda_max with "
                    "learnable edge weights (its gradient through the global "
                    "maximum is not supported)")
            lambda_max = 2.0 * comm.all_reduce(edge_weight.max().detach(),
                                               'max')
        elif not isinstance(lambda_max, Tensor):
            lambda_max = torch.tensor(lambda_max, dtype=dtype,
                                      device=edge_index.device)
        edge_weight = (2.0 * edge_weight) / lambda_max
        edge_weight.masked_fill_(edge_weight == float('inf'), 0)
        loop_mask = edge_index[0] == edge_index[1]
        edge_weight[loop_mask] -= 1
        return edge_index, edge_weight

    def laplacian(self, edge_index: Tensor, edge_weight: Optional[Tensor],
                  normalization: Optional[str], dtype):
        """PyG's ``get_laplacian`` of the local in-edges, with global
        out-degrees."""
        graph, n = self._sar_graph, self._sar_graph.num_nodes
        edge_index, edge_weight = remove_self_loops(edge_index, edge_weight)
        if edge_weight is None:
            edge_weight = torch.ones(edge_index.size(1), dtype=dtype,
                                     device=edge_index.device)
        row, col = edge_index[0], edge_index[1]
        partial = scatter(edge_weight, row, 0, dim_size=graph.num_ext_nodes,
                          reduce='sum')
        deg = graph.push_halo(partial)
        if normalization is None:  # L = D - A
            edge_index, _ = add_self_loops(edge_index, num_nodes=n)
            return edge_index, torch.cat([-edge_weight, deg], dim=0)
        if normalization == 'sym':
            inv = deg.pow(-0.5)
            inv = graph.fetch_halo(inv.masked_fill(inv == float('inf'), 0))
            edge_weight = inv[row] * edge_weight * inv[col]
        else:  # 'rw'
            inv = 1.0 / deg
            inv = graph.fetch_halo(inv.masked_fill(inv == float('inf'), 0))
            edge_weight = inv[row] * edge_weight
        return add_self_loops(edge_index, -edge_weight, fill_value=1.,
                              num_nodes=n)


register_adapted(pyg_nn.ChebConv, ChebConv)
