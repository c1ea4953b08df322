r"""PyG's :class:`~torch_geometric.nn.conv.DirGNNConv` over a
:class:`~pyg_sar.DistGraph`.

.. math::
    \mathbf{x}^{\prime}_i = \alpha \, \mathrm{conv}_{out}(\mathbf{x},
    A^{\top})_i + (1 - \alpha) \, \mathrm{conv}_{in}(\mathbf{x}, A)_i
    \; (+ \mathbf{\Theta} \mathbf{x}_i)

The flipped graph :math:`A^{\top}` is the graph's :meth:`DistGraph.reverse`
(every worker gets the out-edges of its nodes), on which ``conv_out`` runs as
on any ``DistGraph``.
"""
from typing import Any

import torch_geometric.nn as pyg_nn

from pyg_sar.graph import DistGraph


class DistDirGNNConv(pyg_nn.DirGNNConv):
    """Same constructor, parameters and ``state_dict`` as PyG's; ``forward``
    also takes a :class:`DistGraph` (with a plain ``edge_index`` it is
    PyG's)."""

    def forward(self, x: Any, edge_index: Any) -> Any:
        if not isinstance(edge_index, DistGraph):
            return super().forward(x, edge_index)
        x_in = self.conv_in(x, edge_index)
        x_out = self.conv_out(x, edge_index.reverse())
        out = self.alpha * x_out + (1 - self.alpha) * x_in
        if self.root_weight:
            out = out + self.lin(x)
        return out


def adapt_dir_gnn(module: pyg_nn.DirGNNConv) -> DistDirGNNConv:
    """Switches ``module`` in place to :class:`DistDirGNNConv`."""
    module.__class__ = DistDirGNNConv
    return module
