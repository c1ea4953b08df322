"""What the loaders need of one part (:class:`Shard`): ownership, the local
CSC, the node and edge attributes, read from a :class:`pyg_sar.Partition` or
from PyG's ``LocalFeatureStore``/``LocalGraphStore``."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar.partition import Partition


class Shard:
    """What the loader needs of one part: ownership, the local CSC and the
    local node and edge attributes (rows in local / CSC order)."""

    def __init__(self, rank: int, num_parts: int, num_nodes: int,
                 node_ptr: Tensor, csc_ptr: Tensor, csc_src: Tensor,
                 csc_eid: Tensor, node_attrs: Dict[str, Tensor],
                 edge_attrs: Dict[str, Tensor], fingerprint: str) -> None:
        self.rank = rank
        self.num_parts = num_parts
        self.num_nodes = num_nodes
        self.node_ptr = node_ptr.to(torch.long)
        self.node_start = int(node_ptr[rank])
        self.num_local_nodes = int(node_ptr[rank + 1]) - self.node_start
        self.csc_ptr = csc_ptr.to(torch.long)
        self.csc_src = csc_src.to(torch.long)
        self.csc_eid = csc_eid.to(torch.long)
        self.node_attrs = node_attrs
        self.edge_attrs = edge_attrs
        self.fingerprint = fingerprint
        self._eid_sorted: Optional[Tuple[Tensor, Tensor]] = None

    @classmethod
    def from_partition(cls, part) -> 'Shard':
        return cls(int(part.rank), int(part.num_parts), int(part.num_nodes),
                   part.node_ptr, part.csc_ptr, part.csc_src, part.csc_eid,
                   dict(part.node_attrs), dict(part.edge_attrs),
                   str(part.fingerprint))

    @classmethod
    def from_stores(cls, feature_store, graph_store) -> 'Shard':
        """Reads a part through PyG's ``LocalFeatureStore`` and
        ``LocalGraphStore`` (as loaded by their ``from_partition`` from a
        pyg_sar partition)."""
        if graph_store.meta.get('is_hetero'):
            raise ValueError('Shard reads homogeneous graphs only (the '
                             'stores hold a heterogeneous one: see '
                             'pyg_sar.loader.hetero_shard)')
        rank = int(graph_store.partition_idx)
        num_parts = int(graph_store.num_partitions)
        node_owner = graph_store.node_pb.to(torch.long)
        num_nodes = node_owner.numel()
        if bool((node_owner[1:] < node_owner[:-1]).any()):
            raise ValueError(
                'the stores do not come from a pyg_sar partition: nodes are '
                'not owned in contiguous id ranges (partition the graph with '
                'pyg_sar.partition_graph)')
        node_ptr = torch.zeros(num_parts + 1, dtype=torch.long)
        node_ptr[1:] = torch.cumsum(
            torch.bincount(node_owner, minlength=num_parts), 0)
        start, end = int(node_ptr[rank]), int(node_ptr[rank + 1])

        edge_attr = graph_store.get_all_edge_attrs()[0]
        src, dst = graph_store.get_edge_index(edge_attr)
        eid = graph_store.get_edge_id(edge_attr)
        order = torch.argsort(dst, stable=True)  # CSC: by destination
        src, dst, eid = src[order], dst[order], eid[order]
        if dst.numel() and (int(dst.min()) < start or int(dst.max()) >= end):
            raise ValueError(f'graph store of part {rank} holds edges into '
                             f'nodes it does not own')
        csc_ptr = torch.zeros(end - start + 1, dtype=torch.long)
        csc_ptr[1:] = torch.cumsum(
            torch.bincount(dst - start, minlength=end - start), 0)

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
        return cls(rank, num_parts, num_nodes, node_ptr, csc_ptr, src, eid,
                   node_attrs, {}, fingerprint)

    def owner(self, ids: Tensor) -> Tensor:
        """The part owning each global node id."""
        return torch.searchsorted(self.node_ptr, ids, right=True) - 1

    def edge_rows(self, edge_ids: Tensor) -> Tensor:
        """CSC positions (edge-attribute rows) of local global edge ids."""
        if self._eid_sorted is None:
            self._eid_sorted = torch.sort(self.csc_eid)
        values, positions = self._eid_sorted
        return positions[torch.searchsorted(values, edge_ids)]


def schema(attrs: Dict[str, Tensor]) -> List[Tuple[str, Tuple[int, ...],
                                                     str]]:
    return [(name, tuple(value.shape[1:]), str(value.dtype))
            for name, value in attrs.items()]


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


def to_shard(data: Any) -> Shard:
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


def edge_weight(shard: Shard, weight_attr: Optional[str]
                 ) -> Optional[Tensor]:
    """The sampling weight of every local in-edge (CSC order), from the
    edge attribute ``weight_attr`` (PyG's ``weight_attr``)."""
    if weight_attr is None:
        return None
    if weight_attr not in shard.edge_attrs:
        raise ValueError(
            f"weight_attr {weight_attr!r} is not an edge attribute of the "
            f"part (edge attributes: {sorted(shard.edge_attrs) or 'none'}; "
            f"PyG's stores carry none: pass the pyg_sar Partition)")
    weight = shard.edge_attrs[weight_attr]
    if weight.dim() != 1 or weight.dtype == torch.bool or \
            weight.is_complex():
        raise ValueError(f"weight_attr {weight_attr!r} must be one number "
                         f"per edge (got shape {list(weight.shape)}, "
                         f"{weight.dtype})")
    weight = weight.to(torch.float64)
    if bool((weight < 0).any()) or not bool(torch.isfinite(weight).all()):
        raise ValueError(f"weight_attr {weight_attr!r} must be finite and "
                         f"non-negative")
    return weight
