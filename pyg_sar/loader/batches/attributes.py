"""What a batch is made of after sampling: the attribute rows of its nodes
and edges, fetched from their owners in one exchange (:func:`fetch_sections`),
per node and edge type (:func:`fetch_attributes`; a homogeneous shard is the
one-type case)."""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.loader.sampling.exchange import group_by_owner

# One kind of rows to fetch: (owner of every id, the ids, ids -> local
# rows on their owner, the attributes those rows index).
Section = Tuple[Tensor, Tensor, Callable[[Tensor], Tensor], Dict[str, Tensor]]


def fetch_sections(sections: List[Section], world_size: int, rank: int
                   ) -> List[Dict[str, Tensor]]:
    """Gathers, for every section, the attribute rows of its ids from their
    owners (one ``all_to_all_v`` of requests, one exchange of rows; every
    rank must pass the same sections, in the same order, with the same
    attribute schemas). Returns one ``{name: rows}`` per section, rows in
    the order of the section's ids."""
    if not sections:
        return []
    groups = [group_by_owner(owner, world_size)
              for owner, _, _, _ in sections]
    split = [ids[order].split(counts)
             for (_, ids, _, _), (order, counts) in zip(sections, groups)]
    # One request per peer: [id count of every section | ids, section by
    # section].
    requests = [torch.cat([torch.tensor([counts[q] for _, counts in groups],
                                        dtype=torch.long)] +
                          [pieces[q] for pieces in split])
                for q in range(world_size)]
    received = comm.all_to_all_v(requests)

    def rows_for(request: Tensor) -> List[Tensor]:
        out = []
        offset = len(sections)
        for s, (_, _, local_rows, attrs) in enumerate(sections):
            count = int(request[s])
            rows = local_rows(request[offset:offset + count])
            offset += count
            out += [value[rows] for value in attrs.values()]
        return out

    sends = {q: rows_for(received[q]) for q in range(world_size)
             if q != rank}
    recv_shapes = {
        q: [((counts[q], *value.shape[1:]), value.dtype)
            for (_, _, _, attrs), (_, counts) in zip(sections, groups)
            for value in attrs.values()]
        for q in range(world_size) if q != rank}
    pending = comm.post_exchange(sends, recv_shapes)
    own_rows = rows_for(received[rank])
    answers = pending.wait()
    answers[rank] = own_rows

    out, i = [], 0
    for (_, ids, _, attrs), (order, _) in zip(sections, groups):
        values = {}
        for name, value in attrs.items():
            rows = value.new_empty((ids.numel(), *value.shape[1:]))
            rows[order] = torch.cat([answers[q][i]
                                     for q in range(world_size)])
            values[name] = rows
            i += 1
        out.append(values)
    return out


def fetch_attributes(loader, n_id: Dict[str, Tensor],
                            edge_index: Dict[Tuple, Tensor],
                            e_id: Dict[Tuple, Tensor]
                            ) -> Tuple[Dict[str, Dict[str, Tensor]],
                                       Dict[Tuple, Dict[str, Tensor]]]:
    """The node attributes of every sampled node and the edge attributes of
    every sampled edge (stored by the owner of the edge's destination), per
    type, in one exchange (none when no type has attributes)."""
    shard = loader.shard
    sections, keys = [], []
    for t, nodes in shard.nodes.items():
        if nodes.node_attrs:
            sections.append((nodes.owner(n_id[t]), n_id[t],
                             lambda ids, start=nodes.node_start: ids - start,
                             nodes.node_attrs))
            keys.append(t)
    for e, edges in shard.edges.items():
        if edges.edge_attrs:
            dst = n_id[e[2]][edge_index[e][1]]
            sections.append((shard.nodes[e[2]].owner(dst), e_id[e],
                             edges.edge_rows, edges.edge_attrs))
            keys.append(e)
    values = dict(zip(keys, fetch_sections(sections, loader.world_size,
                                           loader.rank)))
    node_values = {t: values.get(t, {}) for t in shard.node_types}
    edge_values = {e: values.get(e, {}) for e in shard.edge_types}
    return node_values, edge_values
