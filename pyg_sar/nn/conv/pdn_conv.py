r"""PyG's :class:`~torch_geometric.nn.conv.PDNConv` over a
:class:`~pyg_sar.DistGraph`.

.. math::
    \mathbf{x}^{\prime}_i = \sum_{j \in \mathcal{N}(i) \cup \{i\}}
    f_{\Theta}(\textbf{e}_{(j,i)}) \cdot f_{\Omega}(\mathbf{x}_{j})

with :math:`f_{\Theta}` an MLP with a sigmoid output on the edge features,
and, with ``normalize=True``, the weights normalized as PyG's ``gcn_norm``
does: :math:`\hat{e}_{j,i} = e_{j,i} / \sqrt{\hat{d}_j \hat{d}_i}` with
weighted degrees. The MLP is per edge; the degrees of halo sources are
their owners' (:func:`pyg_sar.nn.gcn_norm.gcn_norm`, differentiable, so the
MLP's gradient through remote degrees is exact).
"""
from typing import Optional

import torch_geometric.nn as pyg_nn
from torch import Tensor

from pyg_sar.graph import DistGraph
from pyg_sar.nn.adapter import DistAdapter, register_adapted
from pyg_sar.nn.conv._dist_edges import run_edges
from pyg_sar.nn.gcn_norm import gcn_norm
from pyg_sar.nn.neighborhood import whole_propagate
from pyg_sar.nn.zoo_extra import register_switch


class PDNConv(DistAdapter, pyg_nn.PDNConv):
    r"""The pathfinder discovery network convolutional operator from the
    `"Pathfinder Discovery Networks for Neural Message Passing"
    <https://arxiv.org/abs/2010.12878>`_ paper, over a
    :class:`~pyg_sar.DistGraph` (formula in the module docs). Same
    constructor, parameters and ``state_dict`` as
    :class:`torch_geometric.nn.PDNConv`; with a plain ``edge_index`` it is
    PyG's layer.

    Args:
        in_channels (int): Size of each input sample.
        out_channels (int): Size of each output sample.
        edge_dim (int): Edge feature dimensionality.
        hidden_channels (int): Hidden edge feature dimensionality.
        add_self_loops (bool, optional): Add self loops (with
            ``normalize``).
        normalize (bool, optional): Normalize as ``gcn_norm``.
        bias (bool, optional): Learn an additive bias.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}^{(p)}|, F_{in})`,
          the graph, edge features :math:`(|\mathcal{E}^{(p)}|, D)` in the
          graph's edge order
        - **output:** :math:`(|\mathcal{V}^{(p)}|, F_{out})`
    """

    def forward(self, x: Tensor, edge_index,
                edge_attr: Optional[Tensor] = None) -> Tensor:
        if not isinstance(edge_index, DistGraph):
            return super().forward(x, edge_index, edge_attr)
        graph, ei, edge_attr = run_edges(self, edge_index, edge_attr,
                                         x.device)
        if edge_attr is not None:
            edge_attr = self.mlp(edge_attr).squeeze(-1)
        if self.normalize:
            ei, edge_attr = gcn_norm(graph, ei, edge_attr, False,
                                     self.add_self_loops, self.flow, x.dtype)
        elif edge_attr is None:
            raise ValueError("PDNConv over a DistGraph with normalize=False "
                             "needs edge_attr (its messages are weighted by "
                             "the edge MLP)")
        x = self.lin(x)
        out = whole_propagate(self, graph, ei, dict(x=x,
                                                    edge_weight=edge_attr))
        if self.bias is not None:
            out = out + self.bias
        return out


register_adapted(pyg_nn.PDNConv, PDNConv)
register_switch(pyg_nn.PDNConv, PDNConv)
