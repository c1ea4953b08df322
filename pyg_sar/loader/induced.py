"""Induced subgraphs (PyG's ``subgraph_type='induced'``): after the nodes of
a batch are sampled, the batch gets every edge of the graph between them,
not only the sampled ones.

One collective exchange: a rank sends its batch's node ids to every rank
that owns one of them; the owner marks them in a scratch map over the
global ids and answers, for each of those nodes it owns, the in-edges whose
source is marked. Edges come out ordered by destination (batch order), then
in the owner's CSC order (by source id), at every world size.
"""
from __future__ import annotations

from typing import List, Tuple

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.loader.sampler import _ranges


def _serve(loader, request: Tensor) -> Tensor:
    """``[3, k]`` (source position, destination position, edge id) of the
    edges among ``request`` (a peer's batch, positions in it) that end at
    nodes this rank owns."""
    shard = loader.shard
    if request.numel() == 0:
        return torch.empty(3, 0, dtype=torch.long)
    mark = loader._serve_map()
    mark[request] = torch.arange(request.numel(), dtype=torch.int32)
    try:
        start = shard.node_start
        owned = ((request >= start) &
                 (request < start + shard.num_local_nodes)).nonzero().view(-1)
        local = request[owned] - start
        begin = shard.csc_ptr[local]
        degree = shard.csc_ptr[local + 1] - begin
        positions = _ranges(begin, degree)
        dst_position = torch.repeat_interleave(owned, degree)
        src_position = mark[shard.csc_src[positions]].long()
        keep = src_position >= 0
        return torch.stack([src_position[keep], dst_position[keep],
                            shard.csc_eid[positions][keep]])
    finally:
        mark[request] = -1


def induced_edges(loader, n_id: Tensor) -> Tuple[Tensor, Tensor]:
    """``(edge_index, e_id)`` of every edge between the nodes ``n_id`` of
    this rank's batch (batch-local ids); collective."""
    shard, world_size, rank = loader.shard, loader.world_size, loader.rank
    owners = torch.zeros(world_size, dtype=torch.bool)
    owners[shard.owner(n_id)] = True
    requests: List[Tensor] = [n_id if bool(owners[q]) else n_id[:0]
                              for q in range(world_size)]
    received = comm.all_to_all_v(requests)
    replies = [_serve(loader, received[q]).reshape(-1) if q != rank
               else n_id[:0] for q in range(world_size)]
    own = _serve(loader, n_id) if bool(owners[rank]) else \
        torch.empty(3, 0, dtype=torch.long)
    answers = comm.all_to_all_v(replies)
    parts = [own if q == rank else answers[q].view(3, -1)
             for q in range(world_size)]
    edges = torch.cat(parts, dim=1)
    # By destination (batch order); each destination's edges come from one
    # owner, already in its CSC order.
    order = torch.argsort(edges[1], stable=True)
    edges = edges[:, order]
    return edges[:2], edges[2]
