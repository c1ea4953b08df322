r"""PyG's :class:`~torch_geometric.nn.models.CorrectAndSmooth` over a
:class:`~pyg_sar.DistGraph`.

.. math::
    \mathbf{e}^{(0)}_i = \begin{cases} \mathbf{y}_i - \mathbf{z}_i, &
    i \text{ a training node,} \\ \mathbf{0}, & \text{else} \end{cases}
    \qquad \mathbf{\hat{Z}} = \mathbf{Z} + \gamma \cdot
    \mathbf{E}^{(L_1)}

with :math:`\mathbf{E}^{(L_1)}` the error propagated by ``prop1``, then the
training labels put back into :math:`\mathbf{\hat{Z}}` and smoothed by
``prop2`` (both :class:`~pyg_sar.nn.models.LabelPropagation`, converted with
the model). ``y_true`` holds the labels of the training nodes that ``mask``
selects, as in PyG; over a ``DistGraph`` both are the *local* ones (``mask``
a mask or index of the local nodes, ``y_true`` one row per selected local
node). With ``autoscale`` the scale :math:`\gamma_i = \sigma /
\lVert \mathbf{e}^{(L_1)}_i \rVert_1` uses PyG's
:math:`\sigma = \sum_{i \in \text{train}} \lVert \mathbf{e}^{(0)}_i
\rVert_1 / |\text{train}|` over the training nodes of *all* workers (one
all-reduce of the sum and the count); everything else is per node.
"""
import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.utils import one_hot

from pyg_sar import comm
from pyg_sar.graph import DistGraph
# Registers LabelPropagation, so that prop1 and prop2 are converted too.
import pyg_sar.nn.models.label_propagation  # noqa: F401
from pyg_sar.nn.zoo_extra import register_switch


class CorrectAndSmooth(pyg_nn.models.CorrectAndSmooth):
    r"""The correct and smooth (C&S) post-processing of `"Combining Label
    Propagation And Simple Models Out-performs Graph Neural Networks"
    <https://arxiv.org/abs/2010.13993>`_, over a :class:`~pyg_sar.DistGraph`
    (see the module docs). Same constructor and (empty) state as
    :class:`torch_geometric.nn.models.CorrectAndSmooth`; with a plain
    ``edge_index`` it is PyG's. ``correct``, ``smooth`` and ``forward`` are
    collective over a ``DistGraph``.

    Args:
        num_correction_layers (int): The number of propagations :math:`L_1`.
        correction_alpha (float): The :math:`\alpha_1` coefficient.
        num_smoothing_layers (int): The number of propagations :math:`L_2`.
        smoothing_alpha (float): The :math:`\alpha_2` coefficient.
        autoscale (bool, optional): Determine :math:`\gamma` automatically
            (over the training nodes of all workers). (default: ``True``)
        scale (float, optional): The scaling factor :math:`\gamma` with
            ``autoscale=False``. (default: ``1.0``)

    Shapes:
        - **input:** soft predictions :math:`(|\mathcal{V}^{(p)}|, C)` of the
          local nodes, labels ``y_true`` :math:`(|\mathcal{M}^{(p)}|)`
          (``long``) or :math:`(|\mathcal{M}^{(p)}|, C)` of the local
          training nodes :math:`\mathcal{M}^{(p)}` that ``mask`` selects, the
          graph, optional ``edge_weight`` :math:`(|\mathcal{E}^{(p)}|)`
        - **output:** :math:`(|\mathcal{V}^{(p)}|, C)`
    """

    def correct(self, y_soft: Tensor, y_true: Tensor, mask: Tensor,
                edge_index, edge_weight=None) -> Tensor:
        if not isinstance(edge_index, DistGraph) or not self.autoscale:
            # Without autoscale every step is per node or a propagation.
            return super().correct(y_soft, y_true, mask, edge_index,
                                   edge_weight)
        numel = int(mask.sum()) if mask.dtype == torch.bool else mask.size(0)
        assert y_true.size(0) == numel
        if y_true.dtype == torch.long and y_true.size(0) == y_true.numel():
            y_true = one_hot(y_true.view(-1), num_classes=y_soft.size(-1),
                             dtype=y_soft.dtype)
        error = torch.zeros_like(y_soft)
        error[mask] = y_true - y_soft[mask]
        smoothed_error = self.prop1(error, edge_index,
                                    edge_weight=edge_weight,
                                    post_step=lambda x: x.clamp_(-1., 1.))
        # PyG's sigma over the training nodes of the whole graph.
        total = comm.all_reduce(error[mask].abs().sum().reshape(1))[0]
        sigma = total / comm.global_count(numel)
        scale = sigma / smoothed_error.abs().sum(dim=1, keepdim=True)
        scale[scale.isinf() | (scale > 1000)] = 1.0
        return y_soft + scale * smoothed_error


register_switch(pyg_nn.models.CorrectAndSmooth, CorrectAndSmooth)