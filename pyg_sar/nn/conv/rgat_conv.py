r"""PyG's :class:`~torch_geometric.nn.conv.RGATConv` over a
:class:`~pyg_sar.DistGraph` with typed edges (a homogeneous partition of
``HeteroData.to_homogeneous()``, ``edge_type`` in the graph's edge order).

.. math::
    \mathbf{x}^{\prime}_i = \sum_{r \in \mathcal{R}}
    \sum_{j \in \mathcal{N}_r(i)} \alpha_{i,j}^{(r)}
    \mathbf{W}_r \mathbf{x}_j, \qquad
    \alpha_{i,j}^{(r)} = \mathrm{softmax}\left(
    a\left(\mathbf{q}^{\top} \mathbf{W}_r \mathbf{x}_i,\,
    \mathbf{k}^{\top} \mathbf{W}_r \mathbf{x}_j\right)\right)

with :math:`a` the additive (:math:`\mathrm{LeakyReLU}(q_i + k_j)`) or
multiplicative (:math:`q_i \cdot k_j`) self-attention, and the softmax over
the in-edges of :math:`i` of relation :math:`r` (``"within-relation"``) or of
every relation (``"across-relation"``). Every term depends on one destination
and its in-edges, so PyG's own ``forward`` runs unchanged over complete
in-neighborhoods (:mod:`pyg_sar.nn.neighborhood`): the halo rows of
:math:`\mathbf{x}` are fetched once, destinations are processed in chunks of
whole neighborhoods (checkpointed in ``"sar"`` mode). Every ``mod``
(``"additive"``, ``"scaled"``, ``"f-additive"``, ``"f-scaled"``), the basis
and block decompositions and edge features are PyG's.
"""
import torch_geometric.nn as pyg_nn

from pyg_sar.graph import DistGraph
from pyg_sar.nn.adapter import DistAdapter, register_adapted


class RGATConv(DistAdapter, pyg_nn.RGATConv):
    r"""The relational graph attentional operator from the `"Relational
    Graph Attention Networks" <https://arxiv.org/abs/1904.05811>`_ paper,
    over a :class:`~pyg_sar.DistGraph` (see the module docs for the
    formula). Same constructor, parameters and ``state_dict`` as
    :class:`torch_geometric.nn.RGATConv`; with a plain ``edge_index`` it is
    PyG's layer.

    Args:
        in_channels (int): Size of each input sample.
        out_channels (int): Size of each output sample.
        num_relations (int): Number of relations.
        **kwargs (optional): Every other argument of
            :class:`torch_geometric.nn.RGATConv` (``attention_mechanism``,
            ``attention_mode``, ``heads``, ``dim``, ``concat``, ``mod``,
            ``num_bases``, ``num_blocks``, ``edge_dim``, ...).

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}^{(p)}|, F_{in})` of
          the local nodes, the graph, ``edge_type``
          :math:`(|\mathcal{E}^{(p)}|)` and optional ``edge_attr``
          :math:`(|\mathcal{E}^{(p)}|, D)`, both in the graph's edge order
          (e.g. ``part.edge_type``, ``part.edge_attr``)
        - **output:** node features :math:`(|\mathcal{V}^{(p)}|,
          H \cdot F_{out})` (as PyG's for ``concat``, ``dim``)
    """

    def forward(self, x, edge_index, edge_type=None, edge_attr=None,
                size=None, return_attention_weights=None):
        if isinstance(edge_index, DistGraph):
            check_no_attention_weights(self, return_attention_weights)
            if edge_type is None:
                raise ValueError(f"{type(self).__name__} over a DistGraph "
                                 f"needs edge_type (one relation id per "
                                 f"local edge, e.g. part.edge_type)")
        return super().forward(x, edge_index, edge_type, edge_attr, size,
                               return_attention_weights)


def check_no_attention_weights(module, return_attention_weights) -> None:
    """Attention weights per edge are computed chunk by chunk and not kept:
    asking for them over a DistGraph is refused."""
    if return_attention_weights is not None:
        raise ValueError(f"{type(module).__name__}: return_attention_weights "
                         f"is not supported over a DistGraph (the attention "
                         f"of each edge is computed chunk by chunk and not "
                         f"kept); call it without return_attention_weights")


register_adapted(pyg_nn.RGATConv, RGATConv)
