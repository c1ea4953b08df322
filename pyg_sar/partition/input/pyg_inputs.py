"""PyG's input idioms, normalized before a graph is partitioned.

* ``adj_t`` (what ``T.ToSparseTensor()`` leaves in place of ``edge_index``):
  a ``torch_sparse.SparseTensor`` or a torch sparse COO/CSR tensor, stored
  transposed (row = destination, column = source), with or without values.
  It becomes ``edge_index`` (``[source, destination]``) and, where it holds
  values, ``edge_weight``: the partition stores them as every edge
  attribute, in its edge order, marked as ``adj_t``'s values: the
  :class:`~pyg_sar.DistGraph` of such a partition stands in for ``adj_t``,
  and a layer that takes ``edge_weight`` and is called without one gets
  them, as from ``adj_t`` in PyG (:func:`pyg_sar.nn.message_passing.fill_adj_t_values`).
* ``edge_label`` / ``edge_label_index`` (what ``T.RandomLinkSplit`` adds):
  supervision pairs, not edges of the graph, so they are refused in one line
  that names ``RandomLinkSplit`` and says what to do (keep them aside in
  input ids; :meth:`DistGraph.global_ids` maps them after loading).

:func:`normalize_pyg_inputs` returns a shallow copy; the caller's ``data`` is
not changed.
"""
from __future__ import annotations

import copy
from typing import Any, Optional, Tuple

import torch
from torch import Tensor

LINK_SPLIT_ATTRS = ('edge_label', 'edge_label_index', 'pos_edge_label',
                    'pos_edge_label_index', 'neg_edge_label',
                    'neg_edge_label_index')


def normalize_pyg_inputs(data: Any) -> Any:
    """``data`` with ``adj_t`` turned into ``edge_index`` (+ ``edge_weight``)
    and link-split attributes refused (see the module docs). Anything that
    is not an in-memory homogeneous ``Data`` is returned as is."""
    from torch_geometric.data import Data
    if not isinstance(data, Data):
        return data
    keys = set(data.keys())
    split = [k for k in LINK_SPLIT_ATTRS if k in keys]
    if split:
        raise ValueError(
            f"partition_graph: data.{split[0]} is a RandomLinkSplit "
            f"supervision attribute, not a node or edge attribute; delete "
            f"{', '.join('data.' + k for k in split)} before partitioning, "
            f"keep them aside (input node ids) and map them after loading "
            f"with graph.global_ids(...) (see the 'PyG idioms' tutorial)")
    if 'adj_t' not in keys:
        return data
    if 'edge_index' in keys:
        raise ValueError(
            "partition_graph: data has both 'edge_index' and 'adj_t'; keep "
            "one (T.ToSparseTensor(remove_edge_index=True) keeps adj_t)")
    edge_index, value = adj_t_to_edge_index(data.adj_t)
    if value is not None and 'edge_weight' in keys:
        raise ValueError(
            "partition_graph: data has both 'edge_weight' and values in "
            "'adj_t'; keep one (the adj_t values become edge_weight)")
    out = copy.copy(data)
    del out.adj_t
    out.edge_index = edge_index
    if value is not None:
        out.edge_weight = value
        # The DistGraph stands in for adj_t, values included
        # (pyg_sar.nn.message_passing.fill_adj_t_values).
        out.adj_t_values = 'edge_weight'
    if 'num_nodes' not in keys and 'x' not in keys:
        out.num_nodes = int(data.adj_t.size(0))
    return out


def adj_t_to_edge_index(adj_t: Any) -> Tuple[Tensor, Optional[Tensor]]:
    """``(edge_index, values)`` of a transposed adjacency (row = destination,
    column = source): ``edge_index`` is ``[source, destination]``, ``values``
    ``None`` where the adjacency has none. A square adjacency is required."""
    name = type(adj_t).__name__
    if name == 'SparseTensor':  # torch_sparse, when installed
        row, col, value = adj_t.coo()
        size = tuple(adj_t.sizes())
    elif isinstance(adj_t, Tensor) and adj_t.layout in (
            torch.sparse_coo, torch.sparse_csr):
        coo = adj_t.to_sparse_coo().coalesce()
        (row, col), value = coo.indices(), coo.values()
        size = tuple(adj_t.shape)
        if value.numel() and bool((value == 1).all()) and \
                not value.is_floating_point():
            value = None
    else:
        raise ValueError(
            f"partition_graph: data.adj_t must be a torch_sparse.SparseTensor "
            f"or a torch sparse COO/CSR tensor (got {name})")
    if len(size) != 2 or size[0] != size[1]:
        raise ValueError(f"partition_graph: data.adj_t must be a square "
                         f"[num_nodes, num_nodes] adjacency (got size "
                         f"{size})")
    if value is not None and value.dim() != 1:
        raise ValueError(f"partition_graph: data.adj_t values must be one "
                         f"weight per edge (got shape {tuple(value.shape)})")
    edge_index = torch.stack([col, row]).to(torch.long)
    return edge_index, value
