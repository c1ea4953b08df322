r"""PyG's :class:`~torch_geometric.nn.conv.SignedConv` over two
:class:`~pyg_sar.DistGraph`\ s, one per edge sign.

.. math::
    \mathbf{x}_v^{(\textrm{pos})} = \mathbf{\Theta}^{(\textrm{pos})}
    \left[ \frac{1}{|\mathcal{N}^{+}(v)|} \sum_{w \in \mathcal{N}^{+}(v)}
    \mathbf{x}_w , \mathbf{x}_v \right], \quad
    \mathbf{x}_v^{(\textrm{neg})} = \mathbf{\Theta}^{(\textrm{neg})}
    \left[ \frac{1}{|\mathcal{N}^{-}(v)|} \sum_{w \in \mathcal{N}^{-}(v)}
    \mathbf{x}_w , \mathbf{x}_v \right]

(first layer; deeper layers mix balanced and unbalanced paths as PyG
does). PyG takes ``(x, pos_edge_index, neg_edge_index)``; here the two edge
sets are two graphs over the same node partition: partition a
:class:`~torch_geometric.data.HeteroData` with one node type and two
relations (e.g. ``('v', 'pos', 'v')`` and ``('v', 'neg', 'v')``), and pass
``graph[pos_relation]`` and ``graph[neg_relation]``. Each ``propagate``
runs over whole neighborhoods of its own graph.
"""
from typing import Any

import torch
import torch_geometric.nn as pyg_nn

from pyg_sar.graph import DistGraph
from pyg_sar.nn.adapter import DistAdapter, register_adapted
from pyg_sar.nn.neighborhood import log_once, propagate_on_graph
from pyg_sar.nn.zoo_extra import register_switch


class SignedConv(DistAdapter, pyg_nn.SignedConv):
    r"""The signed graph convolutional operator from the `"Signed Graph
    Convolutional Network" <https://arxiv.org/abs/1808.06354>`_ paper, over
    two :class:`~pyg_sar.DistGraph`\ s (see the module docs). Same
    constructor, parameters and ``state_dict`` as
    :class:`torch_geometric.nn.SignedConv`; with plain edge indices it is
    PyG's layer.

    Args:
        in_channels (int): Size of each input sample.
        out_channels (int): Size of each output sample.
        first_aggr (bool): Whether this is the first layer.
        bias (bool, optional): Learn an additive bias.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}^{(p)}|, F_{in})` of
          the local nodes, the positive and the negative graph
        - **output:** :math:`(|\mathcal{V}^{(p)}|, 2 F_{out})`
    """

    def forward(self, x: Any, pos_edge_index: Any, neg_edge_index: Any):
        graphs = (pos_edge_index, neg_edge_index)
        dist = [isinstance(g, DistGraph) for g in graphs]
        if not any(dist):
            return pyg_nn.SignedConv.forward(self, x, *graphs)
        if not all(dist):
            raise ValueError("SignedConv over a DistGraph: pass both the "
                             "positive and the negative edges as DistGraphs")
        pos, neg = graphs
        if pos.is_bipartite or neg.is_bipartite:
            raise ValueError("SignedConv over a bipartite relation graph "
                             "(source and destination types differ) is not "
                             "supported")
        if pos.num_nodes != neg.num_nodes or not torch.equal(
                pos.node_ptr.cpu(), neg.node_ptr.cpu()):
            raise ValueError(
                f"SignedConv over DistGraphs: the positive and negative "
                f"graphs partition the nodes differently ({pos.num_nodes} "
                f"and {neg.num_nodes} local nodes); build both from one "
                f"partition (two relations of one node type)")
        log_once(self, 'a stock PyG layer')
        return pyg_nn.SignedConv.forward(self, x, pos, neg)

    def propagate(self, edge_index: Any, size=None, **kwargs: Any):
        if isinstance(edge_index, DistGraph):
            return propagate_on_graph(self, edge_index, kwargs)
        return super().propagate(edge_index, size=size, **kwargs)


register_adapted(pyg_nn.SignedConv, SignedConv)
register_switch(pyg_nn.SignedConv, SignedConv)
