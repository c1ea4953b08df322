"""A heterogeneous batch: the :class:`~torch_geometric.data.HeteroData` of
a sampled subgraph, with its attributes fetched from their owners, laid out
as PyG's heterogeneous ``NeighborLoader`` lays it out
(:func:`hetero_batch`)."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.data import HeteroData

from pyg_sar.loader.batches.attributes import (ORIG_EID, ORIG_ID,
                                               fetch_attributes, rows_of)
from pyg_sar.loader.batches.data import seed_ids
from pyg_sar.loader.sampling.induced import induced_edges


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
    if loader.induced:
        marks = {t: ids.index for t, ids in loader.batch_ids.items()}
        edge_index, e_id = induced_edges(loader.shard, n_id, marks,
                                         loader.world_size, loader.rank)
        num_sampled_edges = None
    input_id = seed_ids(loader, input_id,
                        n_id[input_type][:int(input_id.numel())]
                        if isinstance(input_type, str) else None)
    sampled_eid = dict(e_id)
    edge_dst = {e: n_id[e[2]][v[1]] for e, v in edge_index.items()}
    e_ids: Dict[Tuple, Optional[Tensor]] = dict(e_id)
    if loader.bidirectional:
        edge_index, e_ids = _to_bidirectional(n_id, edge_index, e_id)
        num_sampled_nodes = num_sampled_edges = None
    if loader.transform_sampler_output is not None:
        n_id, edge_index, e_ids, batch, num_sampled_nodes, \
            num_sampled_edges = _transformed(
                loader, n_id, edge_index, e_ids, batch, num_sampled_nodes,
                num_sampled_edges, input_id, seed_time)
    node_values, edge_values = fetch_attributes(loader, n_id, edge_dst,
                                                sampled_eid)
    for e in loader.shard.edge_types:
        if e_ids.get(e) is None:
            edge_values[e] = {}
        elif e_ids[e] is not sampled_eid[e]:
            at = rows_of(sampled_eid[e], e_ids[e], 'transform_sampler_output')
            edge_values[e] = {k: v[at] for k, v in edge_values[e].items()}
    if loader.ids == 'dataset':
        n_id = {t: node_values[t].pop(ORIG_ID) for t in n_id}
        e_ids = {e: edge_values[e].pop(ORIG_EID, None) if e_ids.get(e)
                 is not None else None for e in loader.shard.edge_types}
    if isinstance(input_type, str) and getattr(loader, 'input_is_mask',
                                               False):
        input_id = n_id[input_type][:int(input_id.numel())]  # user's ids
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
        if e_ids.get(e) is not None:
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


def _transformed(loader, n_id, edge_index, e_ids, batch, num_sampled_nodes,
                 num_sampled_edges, input_id, seed_time):
    """The loader's ``transform_sampler_output`` applied to a
    :class:`~torch_geometric.sampler.HeteroSamplerOutput` of the sample
    (partition ids per type, as PyG's distributed samplers give;
    ``metadata``: ``(input_id, seed_time)``), before the attributes are
    fetched (see :func:`pyg_sar.loader.batches.data.transformed`)."""
    from torch_geometric.sampler import HeteroSamplerOutput
    out = loader.transform_sampler_output(HeteroSamplerOutput(
        node=dict(n_id), row={e: v[0] for e, v in edge_index.items()},
        col={e: v[1] for e, v in edge_index.items()},
        edge={e: v for e, v in e_ids.items() if v is not None},
        batch=batch, num_sampled_nodes=num_sampled_nodes,
        num_sampled_edges=num_sampled_edges,
        metadata=(input_id, seed_time)))
    if not isinstance(out, HeteroSamplerOutput):
        raise TypeError(f"transform_sampler_output must return a "
                        f"HeteroSamplerOutput (got {type(out).__name__})")
    types = loader.shard.node_types
    node = {t: torch.as_tensor(out.node.get(t, n_id[t][:0]),
                               dtype=torch.long) for t in types}
    for t in types:
        limit = loader.shard.nodes[t].num_nodes
        if node[t].numel() and (int(node[t].min()) < 0 or
                                int(node[t].max()) >= limit):
            raise ValueError(f"transform_sampler_output returned {t!r} ids "
                             f"outside [0, {limit}) (the partition's ids)")
    index = {e: torch.stack([out.row[e], out.col[e]]) if e in out.row
             else edge_index[e][:, :0] for e in loader.shard.edge_types}
    edge = {e: (out.edge or {}).get(e) for e in loader.shard.edge_types}
    return (node, index, edge, out.batch, out.num_sampled_nodes,
            out.num_sampled_edges)
