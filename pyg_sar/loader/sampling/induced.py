"""Induced subgraphs (PyG's ``subgraph_type='induced'``): after the nodes of
a batch are sampled, the batch gets every edge of the graph between them,
not only the sampled ones.

One collective exchange (per edge type, for heterogeneous graphs): a rank
sends its batch's node ids to every rank that owns one of them; the owner
marks the sources in a scratch map over the global ids and answers, for
each of the targets it owns, the in-edges whose source is marked. Edges
come out ordered by destination (batch order), then in the owner's CSC order
(by source id), at every world size. The scratch maps are the batch-id maps
of the source types (:class:`~pyg_sar.loader.sampling.neighborhood.BatchIds`),
all ``-1`` once a batch's nodes are sampled.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.loader.sampling.kernel import ranges


def _serve(csc_ptr: Tensor, csc_src: Tensor, csc_eid: Tensor, start: int,
           count: int, mark: Tensor, sources: Tensor, targets: Tensor
           ) -> Tensor:
    """``[3, k]`` (source position, target position, edge id) of the edges
    from ``sources`` to ``targets`` (a peer's batch, positions in it) that
    end at the nodes ``start .. start + count - 1`` this rank owns, whose
    in-edges are the CSC ``csc_ptr``/``csc_src``/``csc_eid``. ``mark`` is a
    scratch map over the source ids, all ``-1``, restored here. A repeated
    target (a repeated seed) gets its in-edges at every position."""
    if targets.numel() == 0 or sources.numel() == 0:
        return torch.empty(3, 0, dtype=torch.long)
    # A repeated source (a repeated seed) is its first row, as in PyG.
    mark[sources] = torch.iinfo(torch.int32).max
    mark.scatter_reduce_(0, sources, torch.arange(sources.numel(),
                                                  dtype=torch.int32), 'amin')
    try:
        owned = ((targets >= start) &
                 (targets < start + count)).nonzero().view(-1)
        local = targets[owned] - start
        begin = csc_ptr[local]
        degree = csc_ptr[local + 1] - begin
        positions = ranges(begin, degree)
        dst_position = torch.repeat_interleave(owned, degree)
        src_position = mark[csc_src[positions]].long()
        keep = src_position >= 0
        return torch.stack([src_position[keep], dst_position[keep],
                            csc_eid[positions][keep]])
    finally:
        mark[sources] = -1


def typed_induced_edges(world_size: int, rank: int, sources: Tensor,
                        targets: Tensor, target_owner: Tensor,
                        serve: Callable[[Tensor, Tensor], Tensor]
                        ) -> Tuple[Tensor, Tensor]:
    """``(edge_index, e_id)`` of every edge from the batch nodes
    ``sources`` to the batch nodes ``targets`` (batch-local ids; the owner
    of every target is ``target_owner``), ``serve(sources, targets)``
    answering on the owner (:func:`_serve`); collective."""
    owners = torch.zeros(world_size, dtype=torch.bool)
    owners[target_owner] = True
    # [number of sources | sources | targets]; -1: the same nodes (sent
    # once, the homogeneous case).
    same = sources is targets
    payload = [torch.tensor([-1]), sources] if same else \
        [torch.tensor([sources.numel()]), sources, targets]
    requests: List[Tensor] = [
        torch.cat(payload) if bool(owners[q]) and q != rank
        else sources[:0] for q in range(world_size)]
    received = comm.all_to_all_v(requests)

    def answer(request: Tensor) -> Tensor:
        if request.numel() == 0:
            return torch.empty(3, 0, dtype=torch.long)
        n = int(request[0])
        if n < 0:
            return serve(request[1:], request[1:])
        return serve(request[1:1 + n], request[1 + n:])
    replies = [answer(received[q]).reshape(-1) if q != rank
               else sources[:0] for q in range(world_size)]
    own = serve(sources, targets) if bool(owners[rank]) else \
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


def induced_edges(shard, n_id: Dict[str, Tensor], marks: Dict[str, Tensor],
                  world_size: int, rank: int
                  ) -> Tuple[Dict[Tuple, Tensor], Dict[Tuple, Tensor]]:
    """Per edge type ``(src, rel, dst)`` of ``shard`` (a
    :class:`~pyg_sar.loader.shards.hetero_shard.HeteroShard`), every edge of
    the graph from the batch's ``src`` nodes ``n_id[src]`` to its ``dst``
    nodes (batch-local ids; one exchange per edge type; collective).
    ``marks[t]`` is a scratch map over the global ids of node type ``t``,
    all ``-1``, restored here."""
    edge_index, e_id = {}, {}
    for e, edges in shard.edges.items():
        src, _, dst = e
        nodes = shard.nodes[dst]

        def serve(sources: Tensor, targets: Tensor, edges=edges,
                  nodes=nodes, mark=marks[src]) -> Tensor:
            return _serve(edges.csc_ptr, edges.csc_src, edges.csc_eid,
                          nodes.node_start, nodes.num_local_nodes, mark,
                          sources, targets)
        edge_index[e], e_id[e] = typed_induced_edges(
            world_size, rank, n_id[src], n_id[dst], nodes.owner(n_id[dst]),
            serve)
    return edge_index, e_id
