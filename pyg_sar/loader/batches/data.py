"""A homogeneous batch: the :class:`~torch_geometric.data.Data` of a sampled
subgraph, with its attributes fetched from their owners, laid out as PyG's
``NeighborLoader`` lays it out (:func:`data_batch`)."""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch
from torch import Tensor
from torch_geometric.data import Data

from pyg_sar.loader.batches.attributes import fetch_attributes
from pyg_sar.loader.sampling.induced import induced_edges
from pyg_sar.loader.shards.base import EDGE, NODE


def data_batch(loader, n_id: Tensor, edge_index: Tensor, e_id: Tensor,
               input_id: Tensor, batch_size: int,
               num_sampled_nodes: List[int], num_sampled_edges: List[int],
               **extra: Tensor) -> Data:
    """The :class:`Data` of a sampled subgraph of ``loader`` (a
    homogeneous loader): attributes fetched from their owners; ``induced``:
    every edge between the nodes instead of the sampled ones (no
    ``num_sampled_edges``); ``bidirectional``: the reverse edges added (no
    per-hop counts, as in PyG); ``extra``: further keys (``batch``,
    ``seed_time``)."""
    counts = dict(num_sampled_nodes=num_sampled_nodes,
                  num_sampled_edges=num_sampled_edges)
    if loader.induced:
        marks = {NODE: loader.batch_ids[NODE].index}
        edge_index, e_id = (
            x[EDGE] for x in induced_edges(loader.shard, {NODE: n_id}, marks,
                                           loader.world_size, loader.rank))
        del counts['num_sampled_edges']  # edges are not per hop here
    node_values, edge_values = (
        x[t] for x, t in zip(fetch_attributes(loader, {NODE: n_id},
                                              {EDGE: edge_index},
                                              {EDGE: e_id}), (NODE, EDGE)))
    if loader.bidirectional:
        edge_index, e_id, edge_values = _bidirectional(
            edge_index, e_id, edge_values)
        counts = {}  # as PyG: no per-hop counts for the merged edges
    return Data(edge_index=edge_index, n_id=n_id, e_id=e_id,
                input_id=input_id, batch_size=batch_size, **extra,
                **counts, **node_values, **edge_values)


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
