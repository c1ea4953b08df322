"""The distributed graph of one worker of a heterogeneous partition: one
relation graph per edge type.

Every node type is partitioned on its own: part ``p`` owns the ids
``node_ptr[p] .. node_ptr[p + 1] - 1`` of each type, and every edge of a
relation lives with the owner of its destination. The relation graph of
``(src, rel, dst)`` is a :class:`~pyg_sar.DistGraph` from the owners of the
``src`` nodes into the local ``dst`` nodes: bipartite when the two types
differ (its source table has the local ``src`` rows, its destinations the
local ``dst`` rows), a plain graph when they are the same. All three modes,
chunking, and the byte accounting work per relation.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Dict, Iterator, List, Optional, Tuple, Union

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.graph.dist_graph import (DistGraph, check_options,
                                      check_partition_set, explicit_device)

EdgeType = Tuple[str, str, str]


class HeteroDistGraph(Mapping):
    r"""The heterogeneous partition of one worker, ready for distributed
    message passing; what :class:`pyg_sar.DistGraph` returns for a
    heterogeneous partition.

    A read-only mapping from edge type to relation graph, so that it stands
    where PyG expects an ``edge_index_dict``: ``graph[edge_type]`` (a
    ``(src, rel, dst)`` tuple or ``"src__rel__dst"``), ``graph.get(...)``,
    iteration over the edge types. Models take it as ``model(x_dict, graph)``
    (:class:`pyg_sar.nn.HeteroConv`, models converted from
    ``torch_geometric.nn.to_hetero``).

    Collective: every rank builds it at the same time; the ranks check that
    they loaded parts of one partitioning, then agree on each relation's
    exchange plan.

    Args:
        part: The worker's heterogeneous partition
            (:func:`pyg_sar.load_partition`).
        mode: ``"sar"``, ``"sa"`` or ``"one_shot"`` (see
            :class:`~pyg_sar.DistGraph`), for every relation.
        chunk_size: Edges per chunk, for every relation.
        device: Where the index tensors live (see :meth:`to`).

    Attributes:
        node_types, edge_types: As in the partition (same order on every
            rank).
        num_nodes_dict: Local node count per node type.
        node_ptr_dict: Per node type, the first id of every part.
        orig_ids_dict: Per node type, the input-graph id of every local node.
    """

    is_dist_graph = True  # pyg_sar/utils/layer_guard.py

    def __init__(self, part, mode: str = 'sar',
                 chunk_size: Optional[int] = None,
                 device: Optional[torch.device] = None) -> None:
        check_options(mode, chunk_size)
        self.mode, self.chunk_size = mode, chunk_size
        self.rank, self.world_size = int(part.rank), int(part.num_parts)
        self.node_types: List[str] = list(part.node_types)
        self.edge_types: List[EdgeType] = [tuple(e) for e in part.edge_types]
        check_partition_set(part, (
            tuple((t, int(part[t].num_nodes)) for t in self.node_types),
            tuple((e, int(part[e].num_edges)) for e in self.edge_types)),
            dict(mode=mode, chunk_size=chunk_size))
        comm.ensure_channels()
        self.node_ptr_dict: Dict[str, Tensor] = {
            t: part[t].node_ptr.to(torch.long) for t in self.node_types}
        self.num_nodes_dict: Dict[str, int] = {
            t: int(part[t].num_local_nodes) for t in self.node_types}
        self.orig_ids_dict: Dict[str, Optional[Tensor]] = {
            t: getattr(part[t], 'orig_ids', None) for t in self.node_types}
        self._relations: Dict[EdgeType, DistGraph] = {}
        for edge_type in self.edge_types:
            src, _, dst = edge_type
            store = part[edge_type]
            self._relations[edge_type] = DistGraph.relation(
                self.rank, self.world_size, mode, chunk_size,
                self.node_ptr_dict[dst],
                None if src == dst else self.node_ptr_dict[src],
                store.csc_ptr, store.csc_src, store.csc_eid,
                orig_ids=self.orig_ids_dict[dst])
        self.device = torch.device('cpu')
        self._merged: Dict[tuple, tuple] = {}
        if device is not None:
            self.to(device)

    # Mapping over edge types #################################################

    def _key(self, key: Union[EdgeType, str]) -> EdgeType:
        if isinstance(key, str) and key.count('__') == 2:
            key = tuple(key.split('__'))
        if isinstance(key, (tuple, list)):
            key = tuple(key)
            if key in self._relations:
                return key
        raise KeyError(f"{key!r} is not an edge type of this graph (edge "
                       f"types: {self.edge_types})")

    def __getitem__(self, key: Union[EdgeType, str]) -> DistGraph:
        return self._relations[self._key(key)]

    def __contains__(self, key) -> bool:
        try:
            self._key(key)
        except (KeyError, TypeError):
            return False
        return True

    def __iter__(self) -> Iterator[EdgeType]:
        return iter(self.edge_types)

    def __len__(self) -> int:
        return len(self.edge_types)

    # Queries #################################################################

    def metadata(self) -> Tuple[List[str], List[EdgeType]]:
        """``(node_types, edge_types)``, as ``HeteroData.metadata()``."""
        return list(self.node_types), list(self.edge_types)

    @property
    def num_edges_dict(self) -> Dict[EdgeType, int]:
        """Local in-edges per edge type."""
        return {e: g.num_edges for e, g in self._relations.items()}

    @property
    def num_halo_nodes_dict(self) -> Dict[EdgeType, int]:
        """Remote source nodes each relation reads."""
        return {e: g.num_halo_nodes for e, g in self._relations.items()}

    def halo_bytes(self, num_features: Union[int, Dict[str, int]],
                   itemsize: int = 4) -> Dict[EdgeType, int]:
        """Per relation, the lower bound of bytes received by one forward
        pass of a layer that reads ``num_features`` features per source node
        (an int, or a dict per node type)."""
        out = {}
        for (src, rel, dst), g in self._relations.items():
            width = (num_features[src] if isinstance(num_features, dict)
                     else num_features)
            out[(src, rel, dst)] = g.halo_bytes(width, itemsize)
        return out

    def merged(self, node_types: List[str], edge_types: List[EdgeType]):
        """All ``edge_types`` as one bipartite graph into the local nodes of
        ``node_types`` (:func:`pyg_sar.graph.hetero_merge.merge_relations`):
        ``(graph, relation index per edge, first row per node type)``.
        Collective on first use (every rank with the same lists), then
        cached."""
        key = (tuple(node_types), tuple(tuple(e) for e in edge_types))
        if key not in self._merged:
            from pyg_sar.graph.hetero_merge import merge_relations
            self._merged[key] = merge_relations(self, list(key[0]),
                                                list(key[1]))
        return self._merged[key]

    def layer_wise(self, seeds: Dict[str, Tensor], hops: int):
        """Per-propagation destination sets of every node type for outputs
        needed only at ``seeds`` (a dict from node type to a local mask or
        owned global ids), for a model of ``hops`` propagations of every
        relation; collective. Use the result as a context manager around
        the forward (:func:`pyg_sar.graph.mfg.hetero_layer_wise`)."""
        from pyg_sar.graph.mfg import hetero_layer_wise
        return hetero_layer_wise(self, seeds, hops)

    def node_offset(self, node_type: str) -> int:
        """First global id (in the type's numbering) of this worker."""
        return int(self.node_ptr_dict[node_type][self.rank])

    def to(self, device) -> 'HeteroDistGraph':
        """Moves every relation's index tensors to ``device`` in place (see
        :meth:`DistGraph.to`) and returns the graph."""
        device = explicit_device(device)
        self._merged = {}
        for g in self._relations.values():
            g.to(device)
        self.node_ptr_dict = {t: p.to(device)
                              for t, p in self.node_ptr_dict.items()}
        self.orig_ids_dict = {t: (None if v is None else v.to(device))
                              for t, v in self.orig_ids_dict.items()}
        self.device = device
        return self

    def __repr__(self) -> str:
        nodes = ', '.join(f'{t}={n}' for t, n in self.num_nodes_dict.items())
        return (f"HeteroDistGraph(rank={self.rank}/{self.world_size}, "
                f"nodes={{{nodes}}}, relations={len(self.edge_types)}, "
                f"mode={self.mode!r}, chunk_size={self.chunk_size})")

