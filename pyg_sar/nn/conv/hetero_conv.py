"""``HeteroConv``: PyG's heterogeneous wrapper over a
:class:`~pyg_sar.graph.hetero_graph.HeteroDistGraph`."""
from typing import Any, Dict, Optional, Tuple

import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch.nn import Module

from pyg_sar.graph.hetero_graph import HeteroDistGraph
from pyg_sar.nn.plain import is_dist_graph
from pyg_sar.nn.convert import (convert_children, register_composite,
                                to_distributed)

EdgeType = Tuple[str, str, str]


class HeteroConv(pyg_nn.HeteroConv):
    r"""A generic wrapper for computing graph convolution on heterogeneous
    graphs whose relations span workers (PyG's
    :class:`torch_geometric.nn.HeteroConv`, over a
    :class:`~pyg_sar.graph.hetero_graph.HeteroDistGraph`).

    .. math::
        \mathbf{x}^{\prime}_v = \bigoplus_{r = (s, \cdot, t(v))}
        f_r\left(\mathbf{x}_s, \mathbf{x}_{t(v)}, \mathcal{G}_r\right)_v

    Each relation :math:`r` runs its own layer :math:`f_r` on its relation
    graph :math:`\mathcal{G}_r` (bipartite when source and destination types
    differ); the results for a destination type are grouped by ``aggr``
    (:math:`\bigoplus`: ``"sum"``, ``"mean"``, ``"min"``, ``"max"``,
    ``"cat"`` or ``None`` to stack), which needs no communication since every
    relation's output rows are the local destination nodes. As in PyG, a
    relation the graph does not have is skipped.

    Same constructor, parameters and ``state_dict`` as PyG's. Called with
    a plain ``edge_index_dict`` (a sampled batch) it is PyG's
    ``HeteroConv``, its relations' layers running stock. Stock PyG
    layers among ``convs`` are converted with
    :func:`pyg_sar.nn.to_distributed` (refused by name when they have no
    distributed version).

    Args:
        convs (Dict[Tuple[str, str, str], MessagePassing]): A layer per edge
            type.
        aggr (str, optional): How outputs of relations into the same node
            type are grouped. (default: :obj:`"sum"`)

    Shapes:
        - **input:** node features ``x_dict`` (local rows of every node
          type, :math:`(|\mathcal{V}_t^{(p)}|, F_t)`), the
          ``HeteroDistGraph``, and optional ``*_dict`` keyword arguments per
          node or edge type (edge-level ones in each relation's edge order)
        - **output:** a dict of node features per destination type,
          :math:`(|\mathcal{V}_t^{(p)}|, F_t^{\prime})`
    """

    def __init__(self, convs: Dict[EdgeType, Module],
                 aggr: Optional[str] = 'sum') -> None:
        convs = {edge_type: to_distributed(conv)
                 for edge_type, conv in convs.items()}
        super().__init__(convs, aggr)

    def forward(self, x_dict: Dict[str, Tensor], graph: HeteroDistGraph,
                *args_dict: Any, **kwargs_dict: Any) -> Dict[str, Tensor]:
        # A plain edge_index_dict (a sampled batch): PyG's forward, each
        # relation's conv running stock (pyg_sar.nn.plain).
        if is_dist_graph(graph) and not isinstance(graph, HeteroDistGraph):
            raise TypeError(f"pyg_sar.nn.HeteroConv expects a "
                            f"HeteroDistGraph or an edge_index_dict as "
                            f"second argument (got {type(graph).__name__}); "
                            f"build one with pyg_sar.DistGraph(part) on a "
                            f"heterogeneous partition")
        return super().forward(x_dict, graph, *args_dict, **kwargs_dict)


def _from_stock(module: pyg_nn.HeteroConv, path: str,
                strict: bool) -> HeteroConv:
    """A stock ``HeteroConv`` as :class:`HeteroConv`, its relations' convs
    converted in place (:func:`pyg_sar.nn.to_distributed`)."""
    new = HeteroConv({}, module.aggr)
    new.convs = module.convs
    convert_children(new.convs, f'{path}.convs.' if path else 'convs.',
                     strict)
    return new.train(module.training)


register_composite(pyg_nn.HeteroConv, _from_stock)
