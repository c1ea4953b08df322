r"""PyG's :class:`~torch_geometric.nn.models.LabelPropagation` over a
:class:`~pyg_sar.DistGraph`.

.. math::
    \mathbf{Y}^{\prime} = \alpha \cdot \mathbf{D}^{-1/2} \mathbf{A}
    \mathbf{D}^{-1/2} \mathbf{Y} + (1 - \alpha) \mathbf{Y}

repeated ``num_layers`` times, each step followed by ``post_step`` (by
default a clamp to :math:`[0, 1]`). What spans the workers:

- integer labels are one-hot encoded with PyG's ``y.max() + 1`` classes,
  the maximum taken over the labels of *all* workers (each worker's own
  maximum may be smaller);
- without ``edge_weight`` the adjacency is normalized as PyG's
  ``gcn_norm(add_self_loops=False)``, with the degrees of halo sources taken
  from their owners (:func:`pyg_sar.nn.gcn_norm.gcn_norm`); given
  ``edge_weight`` (the partition's, one per local edge), PyG uses the
  weights as they are, and so does this;
- every propagation fetches the halo rows of the current labels and sums
  whole in-neighborhoods (:mod:`pyg_sar.nn.neighborhood`).

``mask`` (a mask or index of the *local* nodes) and ``post_step`` act per
node, as in PyG. The ranks agree (one gather per call) on the number of
classes, ``num_layers``, ``alpha`` and whether ``edge_weight`` is given, so
that every worker sends the same messages the single process would.
"""
from typing import Callable, Optional

import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.utils import one_hot

from pyg_sar import comm
from pyg_sar.graph import DistGraph
from pyg_sar.nn.adapter import DistAdapter
from pyg_sar.nn.gcn_norm import NormalizedEdges, gcn_norm
from pyg_sar.nn.zoo_extra import register_switch


class LabelPropagation(DistAdapter, pyg_nn.models.LabelPropagation):
    r"""The label propagation operator of `"Learning from Labeled and
    Unlabeled Data with Label Propagation"
    <http://mlg.eng.cam.ac.uk/zoubin/papers/CMU-CALD-02-107.pdf>`_, over a
    :class:`~pyg_sar.DistGraph` (see the module docs). Same constructor and
    (empty) state as :class:`torch_geometric.nn.models.LabelPropagation`;
    with a plain ``edge_index`` it is PyG's. Collective over a
    ``DistGraph``.

    Args:
        num_layers (int): The number of propagations.
        alpha (float): The :math:`\alpha` coefficient.

    Shapes:
        - **input:** labels :math:`(|\mathcal{V}^{(p)}|)` (``long``) or
          :math:`(|\mathcal{V}^{(p)}|, C)` of the local nodes, the graph,
          optional ``mask`` :math:`(|\mathcal{V}^{(p)}|)` (``bool``) or an
          index of local nodes, optional ``edge_weight``
          :math:`(|\mathcal{E}^{(p)}|)` (the partition's local edges)
        - **output:** :math:`(|\mathcal{V}^{(p)}|, C)`, ``C`` the number of
          classes of the whole graph for integer labels
    """

    @torch.no_grad()
    def forward(self, y: Tensor, edge_index, mask: Optional[Tensor] = None,
                edge_weight: Optional[Tensor] = None,
                post_step: Optional[Callable[[Tensor], Tensor]] = None
                ) -> Tensor:
        stock = pyg_nn.models.LabelPropagation.forward
        if not isinstance(edge_index, DistGraph):
            return stock(self, y, edge_index, mask, edge_weight, post_step)
        graph = edge_index
        if graph.is_bipartite:
            raise ValueError("LabelPropagation over a DistGraph: a bipartite "
                             "relation graph is not supported (labels "
                             "propagate between nodes of one type)")
        labels = y.dtype == torch.long and y.size(0) == y.numel()
        local_max = int(y.max()) if labels and y.numel() else -1
        widths = comm.agree(
            'running LabelPropagation',
            {'LabelPropagation num_layers': self.num_layers,
             'LabelPropagation alpha': self.alpha,
             'LabelPropagation integer labels': labels,
             'LabelPropagation edge_weight given': edge_weight is not None},
            payload=local_max if labels else tuple(y.shape[1:]))
        if labels:
            y = one_hot(y.view(-1), num_classes=max(widths) + 1)
        elif len(set(widths)) > 1:
            raise ValueError(
                f"LabelPropagation over a DistGraph: the label widths differ "
                f"across ranks ({widths}); every rank must pass the same "
                f"number of classes")
        ei = graph.halo_edge_index().to(y.device)
        if edge_weight is None:
            # PyG: gcn_norm(edge_index, num_nodes, add_self_loops=False),
            # weights of the default dtype.
            ei, edge_weight = gcn_norm(graph, ei, None, improved=False,
                                       add_self_loops=False)
        # Wrapped, the stock forward does not normalize a second time;
        # propagate (DistAdapter) unwraps it and runs whole neighborhoods.
        previous, self._sar_graph = self._sar_graph, graph
        try:
            return stock(self, y, NormalizedEdges(ei), mask, edge_weight,
                         post_step)
        finally:
            self._sar_graph = previous


register_switch(pyg_nn.models.LabelPropagation, LabelPropagation)
