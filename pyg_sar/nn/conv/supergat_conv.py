r"""PyG's :class:`~torch_geometric.nn.conv.SuperGATConv` over a
:class:`~pyg_sar.DistGraph`.

.. math::
    \mathbf{x}^{\prime}_i = \alpha_{i,i}\mathbf{\Theta}\mathbf{x}_{i} +
    \sum_{j \in \mathcal{N}(i)} \alpha_{i,j}\mathbf{\Theta}\mathbf{x}_{j},
    \quad \alpha_{i,j} = \mathrm{softmax}_j(e_{i,j})

with :math:`e_{i,j}` the ``MX`` or ``SD`` attention logits. The softmax runs
over the in-edges of one destination, so the output runs over whole
neighborhoods (:mod:`pyg_sar.nn.neighborhood`), exactly.

In training mode PyG also keeps the attention logits of positive edges (a
random ``edge_sample_ratio`` of all edges) and of negative edges (random
non-edges over all nodes, unless ``neg_edge_index`` is given) for the
self-supervised loss :meth:`get_attention_loss`. Random draws over the
whole graph cannot be the single-process draws at every world size, so over
a ``DistGraph`` training mode needs ``edge_sample_ratio=1.0`` (every edge is
positive, no draw) and ``neg_edge_index``: negative pairs by input-graph
ids, any share of them on each worker (their rows are fetched from the
owners). :meth:`get_attention_loss` then returns this worker's share of
PyG's loss (its sum over workers is PyG's loss, so gradients summed over
workers are PyG's). Anything else in training mode is refused by name.
"""
from typing import Any

import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.utils import add_self_loops, remove_self_loops

from pyg_sar import comm
from pyg_sar.graph import DistGraph
from pyg_sar.nn.adapter import DistAdapter, register_adapted
from pyg_sar.nn.conv._dist_edges import run_edges
from pyg_sar.nn.neighborhood import whole_propagate
from pyg_sar.nn.zoo_extra import register_switch


class SuperGATConv(DistAdapter, pyg_nn.SuperGATConv):
    r"""The self-supervised graph attentional operator from the `"How to
    Find Your Friendly Neighborhood: Graph Attention Design with
    Self-Supervision" <https://openreview.net/forum?id=Wi5KUNlqWty>`_
    paper, over a :class:`~pyg_sar.DistGraph` (see the module docs for
    training mode). Same constructor, parameters and ``state_dict`` as
    :class:`torch_geometric.nn.SuperGATConv`.

    Args:
        in_channels (int): Size of each input sample.
        out_channels (int): Size of each output sample.
        heads (int, optional): Number of attention heads.
        **kwargs (optional): ``concat``, ``negative_slope``, ``dropout``,
            ``add_self_loops``, ``bias``, ``attention_type``,
            ``neg_sample_ratio``, ``edge_sample_ratio``, ``is_undirected``
            as in PyG.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}^{(p)}|, F_{in})` of
          the local nodes, the graph, in training mode negative pairs
          :math:`(2, |\mathcal{E}^{-(p)}|)` (input-graph ids)
        - **output:** :math:`(|\mathcal{V}^{(p)}|, H F_{out})` or
          :math:`(|\mathcal{V}^{(p)}|, F_{out})` if ``concat=False``
    """

    _sar_loss_scale = None

    def forward(self, x: Any, edge_index: Any, neg_edge_index: Any = None,
                batch: Any = None):
        self._sar_loss_scale = None
        if not isinstance(edge_index, DistGraph) or not self.training:
            return super().forward(x, edge_index, neg_edge_index, batch)
        if self.edge_sample_ratio != 1.0 or neg_edge_index is None:
            raise ValueError(
                f"SuperGATConv over a DistGraph in training mode needs "
                f"edge_sample_ratio=1.0 (got {self.edge_sample_ratio}) and "
                f"neg_edge_index (got "
                f"{'None' if neg_edge_index is None else 'a tensor'}): its "
                f"attention loss would sample edges at random over the whole "
                f"graph; pass the negative pairs (input-graph ids), or call "
                f".eval()")
        graph = edge_index
        graph_, ei, _ = run_edges(self, graph, device=x.device)
        N, H, C = x.size(0), self.heads, self.out_channels
        if self.add_self_loops:
            ei, _ = remove_self_loops(ei)
            ei, _ = add_self_loops(ei, num_nodes=N)
        x = self.lin(x).view(-1, H, C)
        out = whole_propagate(self, graph_, ei, dict(x=x))

        x_ext = graph_.fetch_halo(x)
        pos_att = self.get_attention(ei[1], x_ext[ei[1]], x_ext[ei[0]],
                                     num_nodes=N, return_logits=True)
        neg = graph.global_ids(neg_edge_index.to(x.device))
        x_neg = graph.fetch_nodes(x, neg.reshape(-1)).view(2, -1, H, C)
        neg_att = self.get_attention(neg[1], x_neg[1], x_neg[0],
                                     num_nodes=N, return_logits=True)
        self.att_x = torch.cat([pos_att, neg_att], dim=0)
        self.att_y = self.att_x.new_zeros(self.att_x.size(0))
        self.att_y[:pos_att.size(0)] = 1.
        total = torch.tensor([float(self.att_x.size(0))], dtype=torch.float64,
                             device=x.device)
        self._sar_loss_scale = float(comm.all_reduce(total, 'sum'))

        if self.concat is True:
            out = out.view(-1, self.heads * self.out_channels)
        else:
            out = out.mean(dim=1)
        if self.bias is not None:
            out = out + self.bias
        return out

    def get_attention_loss(self) -> Tensor:
        r"""The self-supervised attention loss; after a distributed forward
        in training mode, this worker's share of it (the shares sum to
        PyG's loss)."""
        if self._sar_loss_scale is None or not self.training:
            return super().get_attention_loss()
        return F.binary_cross_entropy_with_logits(
            self.att_x.mean(dim=-1), self.att_y,
            reduction='sum') / self._sar_loss_scale


register_adapted(pyg_nn.SuperGATConv, SuperGATConv)
register_switch(pyg_nn.SuperGATConv, SuperGATConv)
