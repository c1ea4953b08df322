"""The pieces a shard is made of: the nodes of one type
(:class:`NodeShard`: who owns which ids, the local node attributes) and
the in-edges of one edge type's local destinations (:class:`EdgeShard`: a
CSC and the edge attributes). A heterogeneous shard holds one per type; a
homogeneous shard is one of each, and shows itself as the one-type case
(node type :data:`NODE`, edge type :data:`EDGE`) to the code that takes
types, which both loaders share.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

# The node and edge type of a homogeneous graph, for the code that takes
# types.
NODE = 'node'
EDGE = (NODE, 'to', NODE)


class NodeShard:
    """The local nodes of one type: ownership and attributes (rows in local
    order). Part ``p`` owns the ids ``node_ptr[p]`` to
    ``node_ptr[p + 1] - 1``."""

    def __init__(self, rank: int, node_ptr: Tensor,
                 node_attrs: Dict[str, Tensor],
                 orig_ids: Optional[Tensor] = None) -> None:
        self.node_ptr = node_ptr.to(torch.long)
        # The dataset ids of the local nodes (None: unknown, PyG's stores).
        self.orig_ids = None if orig_ids is None else orig_ids.to(torch.long)
        self.num_nodes = int(self.node_ptr[-1])
        self.node_start = int(self.node_ptr[rank])
        self.num_local_nodes = int(self.node_ptr[rank + 1]) - self.node_start
        self.node_attrs = node_attrs

    def owner(self, ids: Tensor) -> Tensor:
        """The part owning each id of this type."""
        return torch.searchsorted(self.node_ptr, ids, right=True) - 1


class EdgeShard:
    """The in-edges of the local destination nodes of one edge type, CSC:
    those of local destination ``v`` are positions
    ``csc_ptr[v]:csc_ptr[v + 1]`` of ``csc_src`` (source ids) and
    ``csc_eid`` (edge ids); edge attributes have rows in CSC order."""

    def __init__(self, csc_ptr: Tensor, csc_src: Tensor, csc_eid: Tensor,
                 edge_attrs: Dict[str, Tensor],
                 orig_eids: Optional[Tensor] = None) -> None:
        self.csc_ptr = csc_ptr.to(torch.long)
        self.csc_src = csc_src.to(torch.long)
        self.csc_eid = csc_eid.to(torch.long)
        self.edge_attrs = edge_attrs
        # The dataset ids of the local edges, CSC order (None: the
        # partition records none: homogeneous parts, PyG's stores).
        self.orig_eids = None if orig_eids is None else \
            orig_eids.to(torch.long)
        # How edge ids find their rows, set at the first lookup: the first
        # id when the ids are consecutive in CSC order (a pyg_sar part's
        # are: a row is an offset), else the sorted ids and their rows.
        self._eid_start: Optional[int] = None
        self._eid_sorted: Optional[Tuple[Tensor, Tensor]] = None

    def edge_rows(self, edge_ids: Tensor) -> Tensor:
        """CSC positions (edge-attribute rows) of local edge ids."""
        if self._eid_start is None and self._eid_sorted is None:
            eid = self.csc_eid
            start = int(eid[0]) if eid.numel() else 0
            if bool((eid == torch.arange(start, start + eid.numel())).all()):
                self._eid_start = start
            else:
                self._eid_sorted = torch.sort(eid)
        if self._eid_start is not None:
            return edge_ids - self._eid_start
        values, positions = self._eid_sorted
        return positions[torch.searchsorted(values, edge_ids)]

    def local_pairs(self, node_start: int, num_local_nodes: int) -> Tensor:
        """``[2, num_edges]``: every local in-edge as a (source,
        destination) pair of global ids, in CSC order; the local
        destinations are ``num_local_nodes`` ids from ``node_start``."""
        dst = torch.repeat_interleave(
            torch.arange(node_start, node_start + num_local_nodes),
            self.csc_ptr.diff())
        return torch.stack([self.csc_src, dst])


def schema(attrs: Dict[str, Tensor]) -> List[Tuple[str, Tuple[int, ...],
                                                     str]]:
    """Name, row shape and dtype of every attribute: what every rank's
    shard must share."""
    return [(name, tuple(value.shape[1:]), str(value.dtype))
            for name, value in attrs.items()]


def edge_weight(edges: EdgeShard, weight_attr: Optional[str]
                ) -> Optional[Tensor]:
    """The sampling weight of every local in-edge of ``edges`` (CSC
    order), from the edge attribute ``weight_attr`` (PyG's
    ``weight_attr``)."""
    if weight_attr is None:
        return None
    if weight_attr not in edges.edge_attrs:
        raise ValueError(
            f"weight_attr {weight_attr!r} is not an edge attribute of the "
            f"part (edge attributes: {sorted(edges.edge_attrs) or 'none'}; "
            f"PyG's stores carry none: pass the pyg_sar Partition)")
    weight = edges.edge_attrs[weight_attr]
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
