"""What a heterogeneous batch is made of after sampling: the node attributes
of every type and the edge attributes of every edge type, fetched from their
owners in one exchange (:func:`fetch_hetero_attributes`), and the
:class:`~torch_geometric.data.HeteroData` laid out as PyG's
``NeighborLoader`` lays it out (:func:`hetero_batch`)."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.data import HeteroData

from pyg_sar import comm
from pyg_sar.loader.batch_parts import _group_by_owner

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
    groups = [_group_by_owner(owner, world_size)
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


def fetch_hetero_attributes(loader, n_id: Dict[str, Tensor],
                            edge_index: Dict[Tuple, Tensor],
                            e_id: Dict[Tuple, Tensor]
                            ) -> Tuple[Dict[str, Dict[str, Tensor]],
                                       Dict[Tuple, Dict[str, Tensor]]]:
    """The node attributes of every sampled node and the edge attributes of
    every sampled edge (stored by the owner of the edge's destination), per
    type, in one exchange."""
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


def hetero_batch(loader, n_id: Dict[str, Tensor],
                 edge_index: Dict[Tuple, Tensor], e_id: Dict[Tuple, Tensor],
                 input_type: str, input_id: Tensor,
                 num_sampled_nodes: Dict[str, List[int]],
                 num_sampled_edges: Dict[Tuple, List[int]],
                 batch: Optional[Dict[str, Tensor]] = None,
                 seed_time: Optional[Tensor] = None) -> HeteroData:
    """The :class:`HeteroData` of a sampled subgraph, with the attributes
    fetched from their owners; keys as PyG's ``NeighborLoader`` sets them
    (a node type without attributes gets ``num_nodes``, as PyG's
    filtering of a :obj:`num_nodes`-only store gives). ``induced``: every
    edge between the nodes instead of the sampled ones (no
    ``num_sampled_edges``); ``bidirectional``: PyG's own
    ``HeteroSamplerOutput.to_bidirectional`` (no per-hop counts; an edge
    type merged with its reverse loses ``e_id`` and its edge attributes,
    as in PyG); ``batch``: disjoint subtrees, per node type."""
    if getattr(loader, 'induced', False):
        from pyg_sar.loader.induced import hetero_induced_edges
        edge_index, e_id = hetero_induced_edges(loader, n_id)
        num_sampled_edges = None
    node_values, edge_values = fetch_hetero_attributes(loader, n_id,
                                                       edge_index, e_id)
    e_ids: Dict[Tuple, Optional[Tensor]] = dict(e_id)
    if getattr(loader, 'bidirectional', False):
        edge_index, e_ids = _to_bidirectional(n_id, edge_index, e_id)
        num_sampled_nodes = num_sampled_edges = None
    data = HeteroData()
    for t in loader.shard.node_types:
        store = data[t]
        for name, value in node_values[t].items():
            store[name] = value
        if not node_values[t]:
            store.num_nodes = n_id[t].numel()
        store.n_id = n_id[t]
        if num_sampled_nodes is not None:
            store.num_sampled_nodes = num_sampled_nodes[t]
        if batch is not None:
            store.batch = batch[t]
    for e in loader.shard.edge_types:
        store = data[e]
        store.edge_index = edge_index[e]
        if e_ids[e] is not None:
            for name, value in edge_values[e].items():
                store[name] = value
            store.e_id = e_ids[e]
        if num_sampled_edges is not None:
            store.num_sampled_edges = num_sampled_edges[e]
    data[input_type].input_id = input_id
    if isinstance(input_type, str):  # node batches (links: an edge type)
        data[input_type].batch_size = int(input_id.numel())
    if seed_time is not None:
        data[input_type].seed_time = seed_time
    return data


def _to_bidirectional(n_id: Dict[str, Tensor],
                      edge_index: Dict[Tuple, Tensor],
                      e_id: Dict[Tuple, Tensor]):
    """PyG's ``HeteroSamplerOutput.to_bidirectional`` of the sample:
    ``(edge_index, e_id)`` per edge type, ``e_id`` ``None`` where PyG
    drops it."""
    import warnings
    from torch_geometric.sampler import HeteroSamplerOutput
    out = HeteroSamplerOutput(
        node=dict(n_id), row={e: v[0] for e, v in edge_index.items()},
        col={e: v[1] for e, v in edge_index.items()}, edge=dict(e_id))
    with warnings.catch_warnings():  # PyG warns of types without reverse
        warnings.simplefilter('ignore')
        out = out.to_bidirectional()
    return ({e: torch.stack([out.row[e], out.col[e]]) for e in edge_index},
            {e: out.edge[e] for e in edge_index})
