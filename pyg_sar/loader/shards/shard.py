"""What a homogeneous loader reads of one part (:class:`Shard`): ownership,
the local CSC, the node and edge attributes, from a
:class:`pyg_sar.Partition` or from PyG's
``LocalFeatureStore``/``LocalGraphStore``."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar.loader.shards.base import EDGE, NODE, EdgeShard, NodeShard
from pyg_sar.loader.shards.stores import (csc_order, is_hetero,
                                          owned_ranges, store_pair)
from pyg_sar.partition import Partition


class Shard(NodeShard, EdgeShard):
    """One homogeneous part as the loader sees it: the nodes of its one
    type (:class:`~pyg_sar.loader.shards.base.NodeShard`) and the in-edges
    of the local nodes (:class:`~pyg_sar.loader.shards.base.EdgeShard`);
    ids are global (partition) ids. As the one-type case of a
    :class:`~pyg_sar.loader.shards.hetero_shard.HeteroShard` its
    :attr:`nodes` and :attr:`edges` are itself, under the types
    :data:`~pyg_sar.loader.shards.base.NODE` and
    :data:`~pyg_sar.loader.shards.base.EDGE`."""

    def __init__(self, rank: int, num_parts: int, num_nodes: int,
                 node_ptr: Tensor, csc_ptr: Tensor, csc_src: Tensor,
                 csc_eid: Tensor, node_attrs: Dict[str, Tensor],
                 edge_attrs: Dict[str, Tensor], fingerprint: str,
                 orig_ids: Optional[Tensor] = None,
                 orig_eids: Optional[Tensor] = None) -> None:
        NodeShard.__init__(self, rank, node_ptr, node_attrs, orig_ids)
        EdgeShard.__init__(self, csc_ptr, csc_src, csc_eid, edge_attrs,
                           orig_eids)
        self.rank = rank
        self.num_parts = num_parts
        self.num_nodes = num_nodes
        self.fingerprint = fingerprint
        self.node_types = [NODE]
        self.edge_types = [EDGE]

    @property
    def nodes(self) -> Dict[str, NodeShard]:
        return {NODE: self}

    @property
    def edges(self) -> Dict[Tuple[str, str, str], EdgeShard]:
        return {EDGE: self}

    @classmethod
    def from_partition(cls, part) -> 'Shard':
        return cls(int(part.rank), int(part.num_parts), int(part.num_nodes),
                   part.node_ptr, part.csc_ptr, part.csc_src, part.csc_eid,
                   dict(part.node_attrs), dict(part.edge_attrs),
                   str(part.fingerprint), part.orig_ids,
                   getattr(part, 'orig_eids', None))

    @classmethod
    def from_stores(cls, feature_store, graph_store) -> 'Shard':
        """Reads a part through PyG's ``LocalFeatureStore`` and
        ``LocalGraphStore`` (as loaded by their ``from_partition`` from a
        pyg_sar partition)."""
        if graph_store.meta.get('is_hetero'):
            raise ValueError('Shard reads homogeneous graphs only (the '
                             'stores hold a heterogeneous one: see '
                             'pyg_sar.loader.shards.hetero_shard)')
        rank = int(graph_store.partition_idx)
        num_parts = int(graph_store.num_partitions)
        num_nodes = graph_store.node_pb.numel()
        node_ptr = owned_ranges(graph_store.node_pb, num_parts)
        start, end = int(node_ptr[rank]), int(node_ptr[rank + 1])

        edge_attr = graph_store.get_all_edge_attrs()[0]
        src, dst = graph_store.get_edge_index(edge_attr)
        eid = graph_store.get_edge_id(edge_attr)
        if dst.numel() and (int(dst.min()) < start or int(dst.max()) >= end):
            raise ValueError(f'graph store of part {rank} holds edges into '
                             f'nodes it does not own')
        order, csc_ptr = csc_order(dst, start, end - start)

        global_ids = feature_store.get_global_id(None)
        if not torch.equal(global_ids.to(torch.long),
                           torch.arange(start, end)):
            raise ValueError(f'feature store of part {rank} does not hold '
                             f'nodes {start}..{end - 1} in order')
        node_attrs = {}
        for attr in feature_store.get_all_tensor_attrs():
            if attr.group_name is None:
                node_attrs[attr.attr_name] = feature_store.get_tensor(
                    None, attr.attr_name)
        labels = getattr(feature_store, 'labels', None)
        if labels is not None:  # PyG's loaders put them in batch.y
            if labels.size(0) != num_nodes:
                raise ValueError(f'feature_store.labels has {labels.size(0)} '
                                 f'rows; expected one per global node '
                                 f'({num_nodes})')
            node_attrs['y'] = labels[start:end]
        fingerprint = f'stores:{num_nodes}:{node_ptr.tolist()}'
        return cls(rank, num_parts, num_nodes, node_ptr, csc_ptr,
                   src[order], eid[order], node_attrs, {}, fingerprint)


def to_shard(data: Any) -> Shard:
    """The shard of ``data``: a homogeneous :class:`pyg_sar.Partition` or
    a pair of PyG stores loaded from one."""
    if is_hetero(data):
        raise ValueError("this loader takes homogeneous graphs only (got a "
                         "heterogeneous part); heterogeneous sampling is "
                         "DistNeighborLoader's")
    if isinstance(data, Partition):
        return Shard.from_partition(data)
    stores = store_pair(data)
    if stores is not None:
        return Shard.from_stores(*stores)
    raise TypeError(f"'data' must be a pyg_sar.Partition or a "
                    f"(LocalFeatureStore, LocalGraphStore) pair (got "
                    f"{type(data).__name__})")
