"""What the heterogeneous loader needs of one part (:class:`HeteroShard`):
per node type the ownership and the node attributes, per edge type the local
CSC and the edge attributes, read from a
:class:`pyg_sar.partition.HeteroPartition` or from PyG's
heterogeneous ``LocalFeatureStore``/``LocalGraphStore``.

Ids are per type and those of the partition: part ``p`` owns the ids
``node_ptr[t][p]`` to ``node_ptr[t][p + 1] - 1`` of node type ``t``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

from pyg_sar.loader.shards.base import EdgeShard, NodeShard, schema
from pyg_sar.loader.shards.stores import csc_order, owned_ranges, store_pair
from pyg_sar.partition import HeteroPartition

EdgeType = Tuple[str, str, str]


class HeteroShard:
    """One heterogeneous part as the loader sees it: :attr:`nodes` (a
    :class:`NodeShard` per node type) and :attr:`edges` (an
    :class:`EdgeShard` per edge type), in the graph's type order."""

    def __init__(self, rank: int, num_parts: int,
                 nodes: Dict[str, NodeShard],
                 edges: Dict[EdgeType, EdgeShard], fingerprint: str) -> None:
        self.rank = rank
        self.num_parts = num_parts
        self.nodes = nodes
        self.edges = edges
        self.node_types: List[str] = list(nodes)
        self.edge_types: List[EdgeType] = list(edges)
        self.fingerprint = fingerprint

    @classmethod
    def from_partition(cls, part) -> 'HeteroShard':
        rank = int(part.rank)
        nodes = {t: NodeShard(rank, part[t].node_ptr,
                              dict(part[t].node_attrs), part[t].orig_ids)
                 for t in part.node_types}
        edges = {e: EdgeShard(part[e].csc_ptr, part[e].csc_src,
                              part[e].csc_eid, dict(part[e].edge_attrs),
                              part[e].orig_eids)
                 for e in part.edge_types}
        return cls(rank, int(part.num_parts), nodes, edges,
                   str(part.fingerprint))

    @classmethod
    def from_stores(cls, feature_store, graph_store) -> 'HeteroShard':
        """Reads a part through PyG's heterogeneous ``LocalFeatureStore``
        and ``LocalGraphStore`` (as loaded by their ``from_partition`` from
        a pyg_sar partition)."""
        rank = int(graph_store.partition_idx)
        num_parts = int(graph_store.num_partitions)
        meta = graph_store.meta
        node_types = list(meta['node_types'])
        edge_types = [tuple(e) for e in meta['edge_types']]
        by_group: Dict[Any, List[str]] = {}
        for attr in feature_store.get_all_tensor_attrs():
            by_group.setdefault(attr.group_name, []).append(attr.attr_name)

        nodes = {}
        for t in node_types:
            ptr = owned_ranges(graph_store.node_pb[t], num_parts,
                               f'nodes of type {t!r}')
            start, end = int(ptr[rank]), int(ptr[rank + 1])
            attrs = {}
            if end > start:
                ids = feature_store.get_global_id(group_name=t)
                if not torch.equal(ids.to(torch.long),
                                   torch.arange(start, end)):
                    raise ValueError(f"feature store of part {rank} does "
                                     f"not hold the {t!r} nodes "
                                     f"{start}..{end - 1} in order")
                for name in by_group.get(t, []):
                    attrs[name] = feature_store.get_tensor(group_name=t,
                                                           attr_name=name)
            nodes[t] = NodeShard(rank, ptr, attrs)
        edge_attrs = {a.edge_type: a for a in graph_store.get_all_edge_attrs()}
        edges = {}
        for e in edge_types:
            dst = nodes[e[2]]
            start = dst.node_start
            count = dst.num_local_nodes
            src_ids, dst_ids = graph_store.get_edge_index(edge_attrs[e])
            eid = graph_store.get_edge_id(edge_attrs[e])
            order, csc_ptr = csc_order(dst_ids, start, count)
            attrs = {}
            for name in by_group.get(e, []):
                attrs[name] = feature_store.get_tensor(
                    group_name=e, attr_name=name)[order]
            edges[e] = EdgeShard(csc_ptr, src_ids[order], eid[order], attrs)
        fingerprint = 'stores:' + str(
            {t: n.node_ptr.tolist() for t, n in nodes.items()})
        return cls(rank, num_parts, nodes, edges, fingerprint)

    def schema(self) -> Tuple:
        """Types and attribute shapes, which every rank must share."""
        return (tuple((t, tuple(schema(n.node_attrs)))
                      for t, n in self.nodes.items()),
                tuple((e, tuple(schema(s.edge_attrs)))
                      for e, s in self.edges.items()))


def to_hetero_shard(data: Any) -> HeteroShard:
    """The shard of ``data``: a :class:`pyg_sar.HeteroPartition` or a pair
    of PyG's heterogeneous stores loaded from one."""
    if isinstance(data, HeteroPartition):
        return HeteroShard.from_partition(data)
    stores = store_pair(data)
    if stores is not None:
        return HeteroShard.from_stores(*stores)
    raise TypeError(f"'data' must be a pyg_sar HeteroPartition or a "
                    f"(LocalFeatureStore, LocalGraphStore) pair (got "
                    f"{type(data).__name__})")
