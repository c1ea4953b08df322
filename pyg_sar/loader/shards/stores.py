"""PyG's ``LocalFeatureStore``/``LocalGraphStore`` as a loader's input:
telling a pair of stores (and a heterogeneous part) apart, and the pieces
both shards rebuild from a graph store (the owned id ranges, the CSC order
of the stored edges). The stores must come from a pyg_sar partition
(loaded with their ``from_partition(root, rank)``), whose parts own
contiguous id ranges.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from torch import Tensor


def is_hetero(data: Any) -> bool:
    """Whether ``data`` is a heterogeneous part or a pair of PyG stores
    holding one."""
    if getattr(data, 'is_hetero', False) is True:
        return True
    if isinstance(data, (tuple, list)) and len(data) == 2:
        for store in data:
            meta = getattr(store, 'meta', None)
            if isinstance(meta, dict) and meta.get('is_hetero'):
                return True
    return False


def store_pair(data: Any) -> Optional[Tuple[Any, Any]]:
    """``(feature_store, graph_store)`` when ``data`` is a pair of PyG's
    ``LocalFeatureStore`` and ``LocalGraphStore`` (in either order), else
    ``None``."""
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        return None
    from torch_geometric.distributed import LocalFeatureStore, LocalGraphStore
    feature_store, graph_store = data
    if isinstance(feature_store, LocalGraphStore) and isinstance(
            graph_store, LocalFeatureStore):
        feature_store, graph_store = graph_store, feature_store
    if isinstance(feature_store, LocalFeatureStore) and isinstance(
            graph_store, LocalGraphStore):
        return feature_store, graph_store
    return None


def owned_ranges(owner: Tensor, num_parts: int, nodes: str = 'nodes'
                 ) -> Tensor:
    """``node_ptr`` (part ``p`` owns ids ``node_ptr[p]`` to
    ``node_ptr[p + 1] - 1``) from the owner of every id (a graph store's
    ``node_pb``); ``nodes`` names them in the error when the owners are
    not contiguous ranges."""
    owner = owner.to(torch.long)
    if bool((owner[1:] < owner[:-1]).any()):
        raise ValueError(
            f"the stores do not come from a pyg_sar partition: {nodes} are "
            f"not owned in contiguous id ranges (partition the graph with "
            f"pyg_sar.partition_graph)")
    node_ptr = torch.zeros(num_parts + 1, dtype=torch.long)
    node_ptr[1:] = torch.cumsum(torch.bincount(owner, minlength=num_parts),
                                0)
    return node_ptr


def csc_order(dst: Tensor, start: int, count: int) -> Tuple[Tensor, Tensor]:
    """``(order, csc_ptr)``: the permutation that sorts stored edges by
    their destination (stably: CSC order) and the CSC pointer of the
    ``count`` local destinations from ``start``."""
    order = torch.argsort(dst, stable=True)
    csc_ptr = torch.zeros(count + 1, dtype=torch.long)
    csc_ptr[1:] = torch.cumsum(
        torch.bincount(dst[order] - start, minlength=count), 0)
    return order, csc_ptr
