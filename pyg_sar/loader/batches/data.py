"""A homogeneous batch: the :class:`~torch_geometric.data.Data` of a sampled
subgraph, with its attributes fetched from their owners, laid out as PyG's
``NeighborLoader`` lays it out (:func:`data_batch`)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.data import Data

from pyg_sar.loader.batches.attributes import (ORIG_EID, ORIG_ID,
                                               fetch_attributes, rows_of)
from pyg_sar.loader.sampling.induced import induced_edges
from pyg_sar.loader.shards.base import EDGE, NODE


def seed_ids(loader, input_id: Tensor, seeds: Tensor) -> Tensor:
    """A batch's ``input_id``: the seeds' positions in the loader's input
    or, for a mask (PyG's ``input_id = mask.nonzero()``), the seeds' ids
    (``seeds``: partition ids here, what ``transform_sampler_output`` is
    given; made the user's ids once the attributes are fetched)."""
    if getattr(loader, 'input_is_mask', False):
        return seeds
    return loader.input_positions[input_id]


def data_batch(loader, n_id: Tensor, edge_index: Tensor, e_id: Tensor,
               input_id: Tensor, batch_size: int,
               num_sampled_nodes: List[int], num_sampled_edges: List[int],
               **extra: Tensor) -> Data:
    """The :class:`Data` of a sampled subgraph of ``loader`` (a
    homogeneous loader; ids are partition ids, ``input_id`` positions in
    the loader's inputs): ``induced``: every edge between the nodes instead
    of the sampled ones (no ``num_sampled_edges``); ``bidirectional``: the
    reverse edges added (no per-hop counts, as in PyG); then the loader's
    ``transform_sampler_output``; then the attributes fetched from their
    owners and the ids made the user's (dataset ids, or partition ids with
    ``ids='partition'``); ``extra``: further keys (``batch``,
    ``seed_time``)."""
    counts: Dict[str, Any] = dict(num_sampled_nodes=num_sampled_nodes,
                                  num_sampled_edges=num_sampled_edges)
    if loader.induced:
        marks = {NODE: loader.batch_ids[NODE].index}
        edge_index, e_id = (
            x[EDGE] for x in induced_edges(loader.shard, {NODE: n_id}, marks,
                                           loader.world_size, loader.rank))
        del counts['num_sampled_edges']  # edges are not per hop here
    input_id = seed_ids(loader, input_id, n_id[:batch_size])
    # The edges whose attributes are fetched, and their destinations.
    sampled_eid, edge_dst = e_id, n_id[edge_index[1]]
    if loader.bidirectional:
        edge_index, e_id = bidirectional(edge_index, e_id)
        counts = {}  # as PyG: no per-hop counts for the merged edges
    if loader.transform_sampler_output is not None:
        n_id, edge_index, e_id, counts = transformed(
            loader, n_id, edge_index, e_id, input_id, counts, extra)
    node_values, edge_values = (
        x[t] for x, t in zip(fetch_attributes(
            loader, {NODE: n_id}, {EDGE: edge_dst}, {EDGE: sampled_eid}),
            (NODE, EDGE)))
    if e_id is None:
        edge_values = {}
    elif e_id is not sampled_eid:
        at = rows_of(sampled_eid, e_id, 'transform_sampler_output'
                     if loader.transform_sampler_output else 'bidirectional')
        edge_values = {k: v[at] for k, v in edge_values.items()}
    if ORIG_ID in node_values:  # ids='dataset'
        n_id = node_values.pop(ORIG_ID)
        e_id = edge_values.pop(ORIG_EID, None)  # none recorded: no e_id
    if getattr(loader, 'input_is_mask', False):
        input_id = n_id[:batch_size]  # the seeds' ids, made the user's
    ids = dict(n_id=n_id) if e_id is None else dict(n_id=n_id, e_id=e_id)
    return Data(edge_index=edge_index, **ids, input_id=input_id,
                batch_size=batch_size, **extra, **counts, **node_values,
                **edge_values)


def bidirectional(edge_index: Tensor, e_id: Tensor) -> Tuple[Tensor, Tensor]:
    """The sampled edges plus their reverses, coalesced by PyG's own
    ``to_bidirectional``; the reverse of an edge keeps its edge id."""
    from torch_geometric.sampler.utils import to_bidirectional
    row, col = edge_index
    new_row, new_col, new_eid = to_bidirectional(row, col, row, col, e_id,
                                                 e_id)
    return torch.stack([new_row, new_col]), new_eid


def transformed(loader, n_id: Tensor, edge_index: Tensor,
                e_id: Optional[Tensor], input_id: Tensor,
                counts: Dict[str, Any], extra: Dict[str, Tensor]):
    """The loader's ``transform_sampler_output`` applied to the sample, as
    PyG applies it: to a :class:`~torch_geometric.sampler.SamplerOutput`
    (``node``: partition node ids, as the samplers of
    ``torch_geometric.distributed`` give; ``row``/``col``: batch-local;
    ``edge``: partition edge ids; ``batch``, ``num_sampled_nodes``,
    ``num_sampled_edges``; ``metadata``: ``(input_id, seed_time)``), before
    the attributes are fetched. It may keep, drop or reorder nodes and
    edges (an edge it returns must be a sampled one: its attributes are
    the sampled edge's). Returns ``(n_id, edge_index, e_id, counts)`` and
    updates ``extra`` (``batch``)."""
    from torch_geometric.sampler import SamplerOutput
    out = loader.transform_sampler_output(SamplerOutput(
        node=n_id, row=edge_index[0], col=edge_index[1], edge=e_id,
        batch=extra.get('batch'),
        num_sampled_nodes=counts.get('num_sampled_nodes'),
        num_sampled_edges=counts.get('num_sampled_edges'),
        metadata=(input_id, extra.get('seed_time'))))
    if not isinstance(out, SamplerOutput):
        raise TypeError(f"transform_sampler_output must return a "
                        f"SamplerOutput (got {type(out).__name__})")
    node = torch.as_tensor(out.node, dtype=torch.long)
    if node.numel() and (int(node.min()) < 0 or
                         int(node.max()) >= loader.shard.num_nodes):
        raise ValueError(f"transform_sampler_output returned node ids "
                         f"outside [0, {loader.shard.num_nodes}) (the "
                         f"partition's ids)")
    if out.batch is not None:
        extra['batch'] = out.batch
    counts = {k: getattr(out, k) for k in ('num_sampled_nodes',
                                           'num_sampled_edges')
              if k in counts and getattr(out, k) is not None}
    return node, torch.stack([out.row, out.col]), out.edge, counts
