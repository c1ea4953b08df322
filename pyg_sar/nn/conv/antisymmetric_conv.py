r"""PyG's :class:`~torch_geometric.nn.conv.AntiSymmetricConv` over a
:class:`~pyg_sar.DistGraph`.

.. math::
    \mathbf{x}^{(\ell)}_i = \mathbf{x}^{(\ell-1)}_i + \epsilon \cdot
    \sigma \left( (\mathbf{W}-\mathbf{W}^T-\gamma \mathbf{I})
    \mathbf{x}^{(\ell-1)}_i + \Phi(\mathbf{X}^{(\ell-1)},
    \mathcal{N}_i) + \mathbf{b}\right)

iterated ``num_iters`` times. Everything but :math:`\Phi` is per node;
:math:`\Phi` (``phi``, ``GCNConv`` by default) is converted like any other
layer (:func:`pyg_sar.nn.to_distributed`), so PyG's own ``forward`` runs
unchanged, once per iteration through the converted ``phi``.
"""
import torch_geometric.nn as pyg_nn

from pyg_sar.nn.zoo_extra import register_switch


class AntiSymmetricConv(pyg_nn.AntiSymmetricConv):
    r"""The anti-symmetric graph convolution from the `"Anti-Symmetric DGN:
    a stable architecture for Deep Graph Networks"
    <https://openreview.net/forum?id=J3Y7cgZOOS>`_ paper, over a
    :class:`~pyg_sar.DistGraph` (formula in the module docs). Same
    constructor, parameters and ``state_dict`` as
    :class:`torch_geometric.nn.AntiSymmetricConv`; ``phi`` must be a layer
    :func:`pyg_sar.nn.to_distributed` converts (it is converted with the
    model).

    Args:
        in_channels (int): Size of each input sample.
        phi (MessagePassing, optional): The aggregation :math:`\Phi`.
        num_iters (int, optional): Number of iterations.
        epsilon (float, optional): Discretization step :math:`\epsilon`.
        gamma (float, optional): Diffusion strength :math:`\gamma`.
        act (str or Callable, optional): The activation :math:`\sigma`.
        act_kwargs (Dict, optional): Arguments of the activation.
        bias (bool, optional): Learn an additive bias.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}^{(p)}|, F)`, the
          graph, further arguments of ``phi``
        - **output:** :math:`(|\mathcal{V}^{(p)}|, F)`
    """

    # Called with a DistGraph by design (pyg_sar/utils/layer_guard.py).
    accepts_dist_graph = True
register_switch(pyg_nn.AntiSymmetricConv, AntiSymmetricConv)
