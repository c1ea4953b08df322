"""What a batch is made of after sampling: the attribute rows of its nodes
and edges, fetched from their owners in one exchange (:func:`fetch_sections`),
per node and edge type (:func:`fetch_attributes`; a homogeneous shard is the
one-type case), of what the loader fetches (:func:`fetch_plan`: the node
attributes asked for, the edge attributes, the dataset ids)."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

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


# The keys under which the dataset ids of nodes and edges travel with their
# attributes (ids='dataset'); a batch never shows them.
ORIG_ID = '__orig_id__'
ORIG_EID = '__orig_eid__'


def fetch_plan(loader, node_attrs: Optional[Sequence[str]]) -> None:
    """Sets ``loader.node_sources`` and ``loader.edge_sources``: per node
    and edge type, the local tensors a batch fetches rows of: the node
    attributes named by ``node_attrs`` (``None``: all of them; ``[]``:
    none), every edge attribute, and with ``loader.ids == 'dataset'`` the
    dataset ids of the nodes and (where the partition records them) of the
    edges."""
    shard = loader.shard
    names = {n for t in shard.node_types for n in shard.nodes[t].node_attrs}
    if node_attrs is not None:
        if isinstance(node_attrs, str) or not all(
                isinstance(n, str) for n in node_attrs):
            raise TypeError(f"'node_attrs' must be a list of attribute names "
                            f"(got {node_attrs!r})")
        missing = sorted(set(node_attrs) - names)
        if missing:
            raise ValueError(f"'node_attrs' names {missing}, which are not "
                             f"node attributes of the part (it has "
                             f"{sorted(names) or 'none'})")
    dataset = loader.ids == 'dataset'
    loader.node_sources, loader.edge_sources = {}, {}
    for t in shard.node_types:
        nodes = shard.nodes[t]
        attrs = {k: v for k, v in nodes.node_attrs.items()
                 if node_attrs is None or k in node_attrs}
        if dataset:
            attrs[ORIG_ID] = nodes.orig_ids
        loader.node_sources[t] = attrs
    for e in shard.edge_types:
        edges = shard.edges[e]
        attrs = dict(edges.edge_attrs)
        if dataset and edges.orig_eids is not None:
            attrs[ORIG_EID] = edges.orig_eids
        loader.edge_sources[e] = attrs


def fetch_attributes(loader, n_id: Dict[str, Tensor],
                     edge_dst: Dict[Tuple, Tensor], e_id: Dict[Tuple, Tensor]
                     ) -> Tuple[Dict[str, Dict[str, Tensor]],
                                Dict[Tuple, Dict[str, Tensor]]]:
    """The fetched rows (:func:`fetch_plan`) of every node ``n_id`` and of
    every edge ``e_id`` (stored by the owner of the edge's destination,
    ``edge_dst``, a global id), per type, in one exchange (none when no
    type has anything to fetch)."""
    shard = loader.shard
    sections, keys = [], []
    for t, nodes in shard.nodes.items():
        if loader.node_sources[t]:
            sections.append((nodes.owner(n_id[t]), n_id[t],
                             lambda ids, start=nodes.node_start: ids - start,
                             loader.node_sources[t]))
            keys.append(t)
    for e, edges in shard.edges.items():
        if loader.edge_sources[e]:
            sections.append((shard.nodes[e[2]].owner(edge_dst[e]), e_id[e],
                             edges.edge_rows, loader.edge_sources[e]))
            keys.append(e)
    values = dict(zip(keys, fetch_sections(sections, loader.world_size,
                                           loader.rank)))
    node_values = {t: values.get(t, {}) for t in shard.node_types}
    edge_values = {e: values.get(e, {}) for e in shard.edge_types}
    return node_values, edge_values


def rows_of(sampled: Tensor, wanted: Tensor, what: str) -> Tensor:
    """The positions in ``sampled`` (the ids whose rows were fetched) of
    every id of ``wanted``; an id not among them is an error naming
    ``what`` (the callable that returned it)."""
    if sampled.numel() == 0:
        if wanted.numel():
            raise ValueError(f"{what} returned edge ids that were not "
                             f"sampled (e.g. {int(wanted[0])})")
        return wanted.new_empty(0)
    order = torch.argsort(sampled)
    at = torch.searchsorted(sampled[order], wanted).clamp(
        max=sampled.numel() - 1)
    found = sampled[order][at] == wanted
    if not bool(found.all()):
        raise ValueError(f"{what} returned edge ids that were not sampled "
                         f"(e.g. {int(wanted[~found][0])}); it may drop or "
                         f"reorder the sampled edges, not add new ones")
    return order[at]
