r"""SIGN's precomputed features over a :class:`~pyg_sar.DistGraph`.

:class:`torch_geometric.transforms.SIGN` stores
:math:`\mathbf{X}^{(k)} = (\mathbf{D}^{-1/2} \mathbf{A}
\mathbf{D}^{-1/2})^k \mathbf{X}` for :math:`k = 1, \ldots, K`: the graph as
it is (no self loops added; existing loops and duplicate edges count as
PyG counts them), :math:`\mathbf{D}` the weighted in-degree (edges summed
at their destination), edge :math:`j \to i` weighted
:math:`e_{j,i} / \sqrt{d_j d_i}` and every message summed at its
destination. :func:`sign_features` computes the same powers on every
worker's nodes through the SAR engine: a node's in-degree is complete with
its owner, the :math:`d_j` of remote sources are fetched once, and each hop
is one exchange of the previous hop's halo rows.
"""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.graph import DistGraph
from pyg_sar.nn.message_passing import DistMessagePassing

__all__ = ['sign_features']


class _WeightedSum(DistMessagePassing):
    """``sum_j w_{j,i} x_j``: one hop of a fixed, normalized adjacency."""
    linear_message = True

    def __init__(self) -> None:
        super().__init__(aggr='add')

    def forward(self, x: Tensor, graph: DistGraph,
                edge_weight: Tensor) -> Tensor:
        return self.propagate(graph, x=x, edge_weight=edge_weight)

    def message(self, x_j: Tensor, edge_weight: Tensor) -> Tensor:
        return edge_weight.view(-1, 1) * x_j

    def message_weight(self, edge_weight: Tensor) -> Tensor:
        return edge_weight


def sym_norm_weights(graph: DistGraph, edge_weight: Optional[Tensor],
                     dtype: torch.dtype) -> Tensor:
    r""":math:`e_{j,i} / \sqrt{d_j d_i}` of every edge of ``graph`` (base
    edge order), :math:`d` the in-degree summed over the edges as they are,
    zero where a degree is zero: SIGN's normalization. Collective."""
    if edge_weight is None:
        edge_weight = torch.ones(graph.num_edges, dtype=dtype,
                                 device=graph.device)
    if edge_weight.shape != (graph.num_edges, ):
        raise ValueError(f"edge_weight must hold one value per edge of the "
                         f"graph ({graph.num_edges}), in its edge order "
                         f"(part.edge_weight); got shape "
                         f"{tuple(edge_weight.shape)}")
    edge_weight = edge_weight.to(dtype)
    dst = graph.edge_dst()
    deg = edge_weight.new_zeros(graph.num_nodes).index_add_(0, dst,
                                                             edge_weight)
    deg_inv_sqrt = deg.pow(-0.5)
    deg_inv_sqrt.masked_fill_(deg_inv_sqrt == float('inf'), 0)
    src_deg = edge_weight.new_empty(graph.num_edges)
    for block, values in zip(graph.blocks,
                             graph.source_values(deg_inv_sqrt)):
        src_deg[block.edge_pos] = values[block.src]
    return src_deg * edge_weight * deg_inv_sqrt[dst]


def sign_features(x: Tensor, graph: DistGraph, K: int,
                  edge_weight: Optional[Tensor] = None) -> List[Tensor]:
    r"""The features :class:`torch_geometric.transforms.SIGN` precomputes,
    for this worker's nodes: ``[A x, A^2 x, ..., A^K x]`` with
    :math:`A = D^{-1/2} A D^{-1/2}` (no self loops added, :math:`D` the
    in-degree), what the transform stores as ``data.x1`` ... ``data.xK``.
    Collective: the ranks agree on ``K``, the dtype and whether edge
    weights are given, or all raise.

    Args:
        x: the local nodes' features (``part.x``).
        graph: this worker's :class:`~pyg_sar.DistGraph`.
        K: the number of hops (at least 1).
        edge_weight: one weight per edge in the graph's edge order
            (``part.edge_weight``, as the transform reads
            ``data.edge_weight``); ``None``: every edge weighs 1.

    Gradients flow to ``x`` (the adjacency is fixed); precompute under
    ``torch.no_grad()`` as the transform does.
    """
    if not isinstance(K, int) or K < 1:
        raise ValueError(f"K must be a positive int (got {K!r})")
    if not isinstance(graph, DistGraph):
        raise TypeError(f"sign_features takes a DistGraph (got "
                        f"{type(graph).__name__}); on one process use "
                        f"torch_geometric.transforms.SIGN")
    if x.size(0) != graph.num_nodes:
        raise ValueError(f"x has {x.size(0)} rows but the graph has "
                         f"{graph.num_nodes} local nodes")
    comm.agree('computing sign_features',
               {'K': K, 'dtype': str(x.dtype),
                'edge_weight': edge_weight is not None})
    weight = sym_norm_weights(graph, edge_weight, x.dtype)
    hop = _WeightedSum()
    xs = [x]
    for _ in range(K):
        xs.append(hop(xs[-1], graph, weight))
    return xs[1:]
