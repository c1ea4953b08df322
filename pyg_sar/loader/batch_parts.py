"""What a batch is made of after sampling: node and edge attributes fetched
from their owners (:func:`fetch_attributes`), the reverse edges of
bidirectional subgraphs, and the relabeling helpers."""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch
from torch import Tensor

from pyg_sar import comm

_INT32_MAX = torch.iinfo(torch.int32).max


def fetch_attributes(loader, n_id: Tensor, e_id: Tensor, e_dst: Tensor
                     ) -> Tuple[Dict[str, Tensor], Dict[str, Tensor]]:
    """Gathers the node attribute rows of ``n_id`` and the edge attribute
    rows of ``e_id`` (edges into the global nodes ``e_dst``, whose owners
    store them) from their owners, in one exchange."""
    shard, world_size, rank = loader.shard, loader.world_size, loader.rank
    with_edges = bool(shard.edge_attrs)
    if with_edges:
        edge_owner = shard.owner(e_dst)
    node_order, node_counts = _group_by_owner(shard.owner(n_id),
                                              world_size)
    node_requests = n_id[node_order].split(node_counts)
    if with_edges:
        edge_order, edge_counts = _group_by_owner(edge_owner, world_size)
        edge_requests = e_id[edge_order].split(edge_counts)
    else:
        edge_counts = [0] * world_size
        edge_requests = [e_id[:0]] * world_size
    # One request per peer: [number of node ids | node ids | edge ids].
    requests = [torch.cat([torch.tensor([n]), nodes, edges])
                for n, nodes, edges in zip(node_counts, node_requests,
                                           edge_requests)]
    received = comm.all_to_all_v(requests)

    def rows_for(request: Tensor) -> List[Tensor]:
        num_node_ids = int(request[0])
        local_rows = request[1:1 + num_node_ids] - shard.node_start
        out = [value[local_rows] for value in shard.node_attrs.values()]
        if with_edges:
            edge_rows = shard.edge_rows(request[1 + num_node_ids:])
            out += [value[edge_rows] for value in shard.edge_attrs.values()]
        return out

    sends = {q: rows_for(received[q]) for q in range(world_size)
             if q != rank}
    attrs = list(shard.node_attrs.values()) + \
        (list(shard.edge_attrs.values()) if with_edges else [])

    def shapes(num_nodes: int, num_edges: int):
        specs = []
        for i, value in enumerate(attrs):
            rows = num_nodes if i < len(shard.node_attrs) else num_edges
            specs.append(((rows, *value.shape[1:]), value.dtype))
        return specs

    recv_shapes = {q: shapes(node_counts[q], edge_counts[q])
                   for q in range(world_size) if q != rank}
    pending = comm.post_exchange(sends, recv_shapes)
    own_rows = rows_for(received[rank])
    answers = pending.wait()
    answers[rank] = own_rows

    def assemble(i: int, order: Tensor, counts: List[int]) -> Tensor:
        value = attrs[i]
        out = value.new_empty((order.numel(), *value.shape[1:]))
        out[order] = torch.cat([answers[q][i] for q in range(world_size)])
        return out

    node_values = {name: assemble(i, node_order, node_counts)
                   for i, name in enumerate(shard.node_attrs)}
    edge_values = {}
    if with_edges:
        offset = len(shard.node_attrs)
        edge_values = {name: assemble(offset + i, edge_order, edge_counts)
                       for i, name in enumerate(shard.edge_attrs)}
    return node_values, edge_values


def _bidirectional(edge_index: Tensor, e_id: Tensor,
                   edge_values: Dict[str, Tensor]
                   ) -> Tuple[Tensor, Tensor, Dict[str, Tensor]]:
    """The sampled edges plus their reverses, coalesced by PyG's own
    ``to_bidirectional``; edge attributes follow their edge ids."""
    from torch_geometric.sampler.utils import to_bidirectional
    row, col = edge_index
    new_row, new_col, new_eid = to_bidirectional(row, col, row, col, e_id,
                                                 e_id)
    order = torch.argsort(e_id)
    at = order[torch.searchsorted(e_id[order], new_eid)] if e_id.numel() \
        else new_eid
    return (torch.stack([new_row, new_col]), new_eid,
            {k: v[at] for k, v in edge_values.items()})


def _first_seen_absent(ids: Tensor, index: Tensor,
                       first_position: Tensor) -> Tensor:
    """The distinct ``ids`` with ``index[id] < 0``, in order of first
    appearance (the order in which PyG's sampler adds new nodes).

    ``first_position`` is a scratch map over all global ids holding
    ``INT32_MAX``; it is used, and restored, here so that the answer costs
    O(len(ids)) instead of a sort."""
    candidates = ids[index[ids] < 0]
    if candidates.numel() == 0:
        return candidates
    position = torch.arange(candidates.numel(), dtype=torch.int32)
    first_position.scatter_reduce_(0, candidates, position, reduce='amin')
    is_first = first_position[candidates] == position
    first_position[candidates] = _INT32_MAX
    return candidates[is_first]


def _group_by_owner(owner: Tensor, world_size: int) -> Tuple[Tensor,
                                                              List[int]]:
    """A stable permutation grouping entries by owner, and the group sizes;
    one linear pass per rank rather than a sort (world sizes are small)."""
    if world_size == 1:
        return torch.arange(owner.numel()), [owner.numel()]
    groups = [(owner == q).nonzero().view(-1) for q in range(world_size)]
    return torch.cat(groups), [g.numel() for g in groups]
