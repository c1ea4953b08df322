r"""Symmetric GCN normalization over a :class:`~pyg_sar.DistGraph`.

PyG's ``gcn_norm`` weighs edge :math:`j \to i` by
:math:`e_{j,i} / \sqrt{\hat{d}_j \hat{d}_i}`. The in-degree
:math:`\hat{d}_i` of a local node is complete locally (all its in-edges live
here); the :math:`\hat{d}_j` of a halo source is its owner's, fetched with the
halo (differentiably, so learnable edge weights get their exact gradient
through remote degrees too).

Layers that normalize this way inside their ``forward`` (``SGConv``,
``APPNP``, ``TAGConv``, ``GCN2Conv``, ``LGConv``, ``SSGConv``,
``MixHopConv``) skip their own normalization when ``edge_index`` is not a
tensor; the adapter hands them a :class:`NormalizedEdges` and the normalized
weights instead, and unwraps it again in ``propagate``.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.utils import add_remaining_self_loops, scatter

from pyg_sar.graph import DistGraph


class NormalizedEdges:
    """An already normalized ``local + halo`` edge index, wrapped so that a
    stock ``forward`` does not normalize it a second time."""

    def __init__(self, edge_index: Tensor) -> None:
        self.edge_index = edge_index


def gcn_norm(graph: DistGraph, edge_index: Tensor,
             edge_weight: Optional[Tensor], improved: bool = False,
             add_self_loops: bool = True, flow: str = 'source_to_target',
             dtype: Optional[torch.dtype] = None
             ) -> Tuple[Tensor, Tensor]:
    """PyG's ``gcn_norm`` of the local edges (``edge_index`` in the
    ``local + halo`` numbering, aggregation side local), with the degrees of
    halo sources taken from their owners. Collective."""
    fill = 2. if improved else 1.
    n = graph.num_nodes
    if add_self_loops:
        edge_index, edge_weight = add_remaining_self_loops(
            edge_index, edge_weight, fill, n)
    if edge_weight is None:
        edge_weight = torch.ones(edge_index.size(1), dtype=dtype,
                                 device=edge_index.device)
    i = 1 if flow == 'source_to_target' else 0
    deg = scatter(edge_weight, edge_index[i], 0, dim_size=n, reduce='sum')
    deg_inv_sqrt = deg.pow(-0.5)
    deg_inv_sqrt = deg_inv_sqrt.masked_fill(deg_inv_sqrt == float('inf'), 0)
    deg_ext = graph.fetch_halo(deg_inv_sqrt)
    row, col = edge_index[0], edge_index[1]
    return edge_index, deg_ext[row] * edge_weight * deg_ext[col]


# Stock layers that normalize like gcn_norm: (improved, add_self_loops), or
# None when this instance does not normalize.
NORMALIZED: Dict[type, Callable[[torch.nn.Module],
                                Optional[Tuple[bool, bool]]]] = {
    pyg_nn.GCNConv: lambda m: (m.improved, m.add_self_loops) if m.normalize
    else None,
    pyg_nn.SGConv: lambda m: (False, m.add_self_loops),
    pyg_nn.SSGConv: lambda m: (False, m.add_self_loops),
    pyg_nn.MixHopConv: lambda m: (False, m.add_self_loops),
    pyg_nn.APPNP: lambda m: (False, m.add_self_loops) if m.normalize
    else None,
    pyg_nn.GCN2Conv: lambda m: (False, m.add_self_loops) if m.normalize
    else None,
    pyg_nn.TAGConv: lambda m: (False, False) if m.normalize else None,
    pyg_nn.LGConv: lambda m: (False, False) if m.normalize else None,
    pyg_nn.ARMAConv: lambda m: (False, False),
    pyg_nn.FAConv: lambda m: (False, m.add_self_loops) if m.normalize
    else None,
}


def normalization(module) -> Optional[Tuple[bool, bool]]:
    """``(improved, add_self_loops)`` of a stock layer's own normalization,
    or ``None``."""
    for cls in type(module).__mro__:
        if cls in NORMALIZED:
            return NORMALIZED[cls](module)
    return None
