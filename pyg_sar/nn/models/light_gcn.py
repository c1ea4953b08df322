r"""PyG's :class:`~torch_geometric.nn.models.LightGCN` over a
:class:`~pyg_sar.DistGraph`, with its node-embedding table sharded by the
partition (:class:`~pyg_sar.nn.DistEmbedding`).

.. math::
    \mathbf{x}_i = \sum_{l=0}^{L} \alpha_l \mathbf{x}^{(l)}_i, \qquad
    \mathbf{x}^{(l+1)}_i = \sum_{j \in \mathcal{N}(i)}
    \frac{1}{\sqrt{\deg(i)\deg(j)}}\mathbf{x}^{(l)}_j

:func:`~pyg_sar.nn.to_distributed` converts the ``LGConv`` layers (GCN
normalization with the halo's degrees) and the ``embedding`` table, which
is sharded on the first call with a ``DistGraph``: each worker keeps the
rows of its own nodes (about ``num_nodes / N``), ``get_embedding`` returns
the rows of the local nodes, exactly the single-process rows of those
nodes. What spans the workers:

- ``forward``/``predict_link`` score the pairs ``edge_label_index`` (input
  graph ids, each worker its own pairs, collective): the rows of both ends
  are fetched from their owners (:func:`pyg_sar.graph.link.fetch_nodes`),
  gradients summed back at the owners. Scoring every edge of the graph
  (``edge_label_index=None``) is refused: name the pairs;
- ``link_pred_loss`` and ``recommendation_loss`` return this worker's share
  of the stock loss (sums over local pairs divided by the counts of all
  workers; the BPR regularization over the local rows, or the fetched rows
  of ``node_id``), so that the shares sum to the stock loss and their
  backward passes to its gradient;
- ``recommend`` (a top-k over every node of the graph) is refused by name.

``reset_parameters`` draws the stock initialization of the whole table
(``xavier_uniform_``) a block of rows at a time and keeps the local rows;
``LightGCN(..., graph=graph)`` builds the table sharded, so that the whole
table never exists on a worker.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn.models import LightGCN as StockLightGCN

from pyg_sar import comm
from pyg_sar.graph import DistGraph
from pyg_sar.graph.link import fetch_nodes, global_ids
from pyg_sar.nn.convert import convert_children, register_composite
from pyg_sar.nn.embedding import DistEmbedding, draw_rows


class LightGCN(StockLightGCN):
    r"""LightGCN with a sharded node-embedding table over a
    :class:`~pyg_sar.DistGraph` (see the module docs). Same constructor and
    state keys as :class:`torch_geometric.nn.models.LightGCN`; until its
    first call with a ``DistGraph`` it is the stock model.

    Args:
        num_nodes (int): The number of nodes of the whole graph.
        embedding_dim (int): The dimensionality of node embeddings.
        num_layers (int): The number of ``LGConv`` layers.
        alpha (float or torch.Tensor, optional): The weights of the layers'
            embeddings (default: :obj:`1 / (num_layers + 1)` each).
        graph (DistGraph, optional): A pyg_sar extension: the table is
            sharded by this graph's partition as it is built, so the whole
            table never exists on a worker (memory ~``num_nodes / N`` rows
            from the start); its rows are the stock model's, built from the
            same random state, which it leaves as the stock constructor
            does. Without it, the stock table is built whole and sharded on
            the first call with a ``DistGraph``.
        **kwargs (optional): Arguments of the ``LGConv`` layers.

    Shapes:
        - **input:** the graph, ``edge_label_index`` :math:`(2, E_p)`
          (input-graph ids, this worker's pairs), optional ``edge_weight``
          :math:`(|\mathcal{E}^{(p)}|)` (the partition's local edges)
        - **output:** :math:`(E_p)`; ``get_embedding``:
          :math:`(|\mathcal{V}^{(p)}|, d)`
    """

    def __init__(self, num_nodes: int, embedding_dim: int, num_layers: int,
                 alpha=None, graph: Optional[DistGraph] = None,
                 **kwargs) -> None:
        if graph is None:
            super().__init__(num_nodes, embedding_dim, num_layers, alpha,
                             **kwargs)
            return
        super().__init__(0, embedding_dim, num_layers, alpha, **kwargs)
        self.num_nodes = num_nodes
        # The stock constructor draws the whole table twice: Embedding's own
        # normal_ (consumed here, nothing kept), then reset_parameters'
        # xavier_uniform_ (this worker's rows kept), a block at a time.
        draw_rows(torch.empty(0, embedding_dim), num_nodes,
                  torch.empty(0, dtype=torch.long))
        table = torch.nn.Embedding(num_nodes, embedding_dim, device='meta')
        self.embedding = DistEmbedding(table).shard_(
            graph, torch.nn.init.xavier_uniform_)

    def reset_parameters(self):
        embedding = getattr(self, 'embedding', None)
        if isinstance(embedding, DistEmbedding) and embedding.sharded:
            embedding.reset_parameters(torch.nn.init.xavier_uniform_)
            for conv in self.convs:
                conv.reset_parameters()
        else:
            super().reset_parameters()

    def _graph(self, edge_index) -> Optional[DistGraph]:
        if isinstance(edge_index, DistGraph):
            self.embedding.shard_(edge_index)
            return edge_index
        if self.embedding.sharded:
            raise ValueError("LightGCN: its embedding table is sharded by a "
                             "partition; call it with the DistGraph, not "
                             "an edge_index")
        return None

    def get_embedding(self, edge_index, edge_weight=None) -> Tensor:
        self._graph(edge_index)
        return super().get_embedding(edge_index, edge_weight)

    def forward(self, edge_index, edge_label_index: Optional[Tensor] = None,
                edge_weight: Optional[Tensor] = None) -> Tensor:
        graph = self._graph(edge_index)
        if graph is None:
            return super().forward(edge_index, edge_label_index, edge_weight)
        if edge_label_index is None:
            raise ValueError(
                "LightGCN over a DistGraph: edge_label_index=None (score "
                "every edge of the graph) is not supported; pass the pairs "
                "this worker scores, in input-graph ids")
        out = self.get_embedding(graph, edge_weight)
        ids = global_ids(graph, edge_label_index)
        rows = fetch_nodes(graph, out, ids.reshape(-1))
        rows = rows.view(2, -1, out.size(-1))
        return (rows[0] * rows[1]).sum(dim=-1)

    def recommend(self, edge_index, *args, **kwargs) -> Tensor:
        if isinstance(edge_index, DistGraph) or self.embedding.sharded:
            raise ValueError(
                "LightGCN.recommend over a DistGraph is not supported: its "
                "top-k ranks every node of the graph for each source; score "
                "candidate pairs with forward(graph, edge_label_index)")
        return super().recommend(edge_index, *args, **kwargs)

    def link_pred_loss(self, pred: Tensor, edge_label: Tensor,
                       **kwargs) -> Tensor:
        if not self.embedding.sharded:
            return super().link_pred_loss(pred, edge_label, **kwargs)
        reduction = kwargs.pop('reduction', 'mean')
        comm.agree('LightGCN.link_pred_loss', {'reduction': reduction})
        loss = F.binary_cross_entropy_with_logits(
            pred, edge_label.to(pred.dtype), reduction='none', **kwargs)
        if reduction == 'none':
            return loss
        if reduction == 'sum':
            return loss.sum()
        return loss.sum() / comm.global_count(loss.numel())

    def recommendation_loss(self, pos_edge_rank: Tensor,
                            neg_edge_rank: Tensor,
                            node_id: Optional[Tensor] = None,
                            lambda_reg: float = 1e-4, **kwargs) -> Tensor:
        if not self.embedding.sharded:
            return super().recommendation_loss(pos_edge_rank, neg_edge_rank,
                                               node_id, lambda_reg, **kwargs)
        if kwargs:
            raise ValueError(f"LightGCN.recommendation_loss over a sharded "
                             f"table: {sorted(kwargs)} not supported")
        comm.agree('LightGCN.recommendation_loss',
                   {'node_id given': node_id is not None,
                    'lambda_reg': float(lambda_reg)})
        counts = comm.all_reduce(torch.tensor(
            [pos_edge_rank.numel(), pos_edge_rank.size(0)]), 'sum')
        log_prob = F.logsigmoid(pos_edge_rank - neg_edge_rank).sum()
        loss = -log_prob / int(counts[0])
        if lambda_reg != 0:
            emb = self.embedding.weight if node_id is None else \
                self.embedding(node_id)
            loss = loss + lambda_reg * emb.pow(2).sum() / int(counts[1])
        return loss


def _convert(module: StockLightGCN, path: str, strict: bool):
    convert_children(module, f'{path}.' if path else '', strict)
    if not isinstance(module.embedding, DistEmbedding):
        module.embedding = DistEmbedding(module.embedding)
    module.__class__ = LightGCN
    return module


register_composite(StockLightGCN, _convert)
