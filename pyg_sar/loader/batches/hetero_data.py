"""A heterogeneous batch: the :class:`~torch_geometric.data.HeteroData` of
a sampled subgraph, with its attributes fetched from their owners, laid out
as PyG's heterogeneous ``NeighborLoader`` lays it out
(:func:`hetero_batch`)."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.data import HeteroData

from pyg_sar.loader.batches.attributes import fetch_attributes
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
    node_values, edge_values = fetch_attributes(loader, n_id, edge_index,
                                                e_id)
    e_ids: Dict[Tuple, Optional[Tensor]] = dict(e_id)
    if loader.bidirectional:
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
