r"""PyG's :class:`~torch_geometric.nn.conv.DNAConv` over a
:class:`~pyg_sar.DistGraph`.

.. math::
    \mathbf{x}_v^{(t)} = h_{\mathbf{\Theta}}^{(t)} \left(
    \mathbf{x}_{v \leftarrow v}^{(t)}, \left\{ \mathbf{x}_{v \leftarrow
    w}^{(t)} : w \in \mathcal{N}(v) \right\} \right), \quad
    \mathbf{x}_{v \leftarrow w}^{(t)} = \textrm{Attention} \left(
    \mathbf{x}^{(t-1)}_v \, \mathbf{\Theta}_Q^{(t)}, [\mathbf{x}_w^{(1)},
    \ldots, \mathbf{x}_w^{(t-1)}] \, \mathbf{\Theta}_K^{(t)}, \,
    [\mathbf{x}_w^{(1)}, \ldots, \mathbf{x}_w^{(t-1)}] \,
    \mathbf{\Theta}_V^{(t)} \right)

The attention runs per edge over the layer history of the source (input
:math:`[N, L, C]`), the messages are summed with the weights of PyG's
``gcn_norm``: the whole layer history of halo sources is fetched once, and
their degrees come from their owners (:mod:`pyg_sar.nn.gcn_norm`).
"""
import torch_geometric.nn as pyg_nn
from torch import Tensor

from pyg_sar.graph import DistGraph
from pyg_sar.nn.adapter import DistAdapter, register_adapted
from pyg_sar.nn.gcn_norm import NORMALIZED
from pyg_sar.nn.zoo_extra import register_switch


class DNAConv(DistAdapter, pyg_nn.DNAConv):
    r"""The dynamic neighborhood aggregation operator from the `"Just Jump:
    Towards Dynamic Neighborhood Aggregation in Graph Neural Networks"
    <https://arxiv.org/abs/1904.04849>`_ paper, over a
    :class:`~pyg_sar.DistGraph` (formula in the module docs). Same
    constructor, parameters and ``state_dict`` as
    :class:`torch_geometric.nn.DNAConv`; with a plain ``edge_index`` it is
    PyG's layer.

    Args:
        channels (int): Size of each input/output sample.
        heads (int, optional): Number of multi-head attentions.
        groups (int, optional): Number of groups of the linear layers.
        dropout (float, optional): Dropout on the attention coefficients.
        cached (bool, optional): PyG's cache of the normalized edges; over a
            ``DistGraph`` the normalization is recomputed every call.
        normalize (bool, optional): Normalize as ``gcn_norm``.
        add_self_loops (bool, optional): Add self loops (with
            ``normalize``).
        bias (bool, optional): Learn an additive bias.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}^{(p)}|, L, F)` (the
          layer history of the local nodes), the graph, optional edge
          weights :math:`(|\mathcal{E}^{(p)}|)` in the graph's edge order
        - **output:** :math:`(|\mathcal{V}^{(p)}|, F)`
    """

    def forward(self, x: Tensor, edge_index, edge_weight=None) -> Tensor:
        if isinstance(edge_index, DistGraph) and x.dim() != 3:
            raise ValueError(f"DNAConv over a DistGraph: x has shape "
                             f"{tuple(x.shape)}; expected [num_nodes, "
                             f"num_layers, channels]")
        return super().forward(x, edge_index, edge_weight)


# DistAdapter normalizes like gcn_norm what DNAConv's forward would.
NORMALIZED[pyg_nn.DNAConv] = (lambda m: (False, m.add_self_loops)
                              if m.normalize else None)
register_adapted(pyg_nn.DNAConv, DNAConv)
register_switch(pyg_nn.DNAConv, DNAConv)
