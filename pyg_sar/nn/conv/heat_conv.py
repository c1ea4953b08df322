r"""PyG's :class:`~torch_geometric.nn.conv.HEATConv` over a
:class:`~pyg_sar.DistGraph` with typed nodes and edges (a homogeneous
partition of ``HeteroData.to_homogeneous()``: ``node_type`` per local node,
``edge_type`` and ``edge_attr`` in the graph's edge order).

.. math::
    \mathbf{x}^{\prime}_i = \mathbf{W}_{\tau(i)} \mathbf{x}_i +
    \sum_{j \in \mathcal{N}(i)} \alpha_{i,j} \left( \mathbf{W}_{\tau(j)}
    \mathbf{x}_j \, \Vert \, \mathbf{e}_{j,i} \right) \mathbf{\Theta},
    \qquad
    \alpha_{i,j} = \mathrm{softmax}_j \left( \mathrm{LeakyReLU} \left(
    \mathbf{a}^{\top} \left[ \mathbf{W}_{\tau(i)} \mathbf{x}_i \, \Vert \,
    \mathbf{W}_{\tau(j)} \mathbf{x}_j \, \Vert \, \mathbf{r}_{\phi(j,i)}
    \, \Vert \, \mathbf{e}_{j,i} \right] \right) \right)

(per head; :math:`\tau` the node type, :math:`\phi` the edge type,
:math:`\mathbf{r}` its embedding, :math:`\mathbf{e}` the embedded edge
features). The type-specific transform is per node and the softmax runs
over the in-edges of one destination, so PyG's own ``forward`` runs
unchanged over complete in-neighborhoods (:mod:`pyg_sar.nn.neighborhood`):
the transformed rows of the halo are fetched once, destinations are
processed in chunks of whole neighborhoods (checkpointed in ``"sar"``
mode).
"""
import torch_geometric.nn as pyg_nn

from pyg_sar.graph import DistGraph
from pyg_sar.nn.adapter import DistAdapter, register_adapted


class HEATConv(DistAdapter, pyg_nn.HEATConv):
    r"""The heterogeneous edge-enhanced graph attentional operator from the
    `"Heterogeneous Edge-Enhanced Graph Attention Network For Multi-Agent
    Trajectory Prediction" <https://arxiv.org/abs/2106.07161>`_ paper, over a
    :class:`~pyg_sar.DistGraph` (see the module docs for the formula). Same
    constructor, parameters and ``state_dict`` as
    :class:`torch_geometric.nn.HEATConv`; with a plain ``edge_index`` it is
    PyG's layer.

    Args:
        in_channels (int): Size of each input sample.
        out_channels (int): Size of each output sample.
        num_node_types (int): Number of node types.
        num_edge_types (int): Number of edge types.
        edge_type_emb_dim (int): Embedding size of edge types.
        edge_dim (int): Edge feature dimensionality.
        edge_attr_emb_dim (int): Embedding size of edge features.
        **kwargs (optional): ``heads``, ``concat``, ``negative_slope``,
            ``dropout``, ``root_weight``, ``bias`` as in PyG.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}^{(p)}|, F_{in})` and
          node types :math:`(|\mathcal{V}^{(p)}|)` of the local nodes, the
          graph, edge types :math:`(|\mathcal{E}^{(p)}|)` and edge features
          :math:`(|\mathcal{E}^{(p)}|, D)` in the graph's edge order
        - **output:** node features :math:`(|\mathcal{V}^{(p)}|,
          H \cdot F_{out})` or :math:`(|\mathcal{V}^{(p)}|, F_{out})` if
          ``concat=False``
    """

    def forward(self, x, edge_index, node_type, edge_type, edge_attr=None):
        if isinstance(edge_index, DistGraph):
            n = edge_index.num_nodes
            if node_type.dim() != 1 or node_type.numel() != n:
                raise ValueError(
                    f"HEATConv over a DistGraph: node_type has shape "
                    f"{tuple(node_type.shape)}; expected ({n},) (one type "
                    f"per local node, e.g. part.node_type)")
            if edge_attr is None:
                raise ValueError("HEATConv over a DistGraph needs edge_attr "
                                 "(its messages embed the edge features)")
        return super().forward(x, edge_index, node_type, edge_type,
                               edge_attr)


register_adapted(pyg_nn.HEATConv, HEATConv)
