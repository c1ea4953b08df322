"""PyG's sampling options on heterogeneous graphs: ``weight_attr``,
``disjoint``, temporal sampling (``time_attr``, ``input_time``,
``temporal_strategy``) and ``subgraph_type``, for
:class:`pyg_sar.loader.hetero.DistHeteroNeighborLoader`.

The typed case reuses the homogeneous pieces: the weighted and temporal
kernels of :mod:`pyg_sar.loader.sampler` and :mod:`pyg_sar.loader.temporal`
run per edge type on the owner of the edge's destination; disjoint subtrees
are :class:`pyg_sar.loader.disjoint.Subtrees`, one per node type.

- ``weight_attr``: an edge attribute; edge types that hold it are sampled
  in proportion to it, the others uniformly.
- ``time_attr``: a node attribute (an edge's time is its source's) or an
  edge attribute, per type: an edge type whose edges and whose source type
  both lack it is not time-filtered. Seeds take ``input_time`` or their own
  node time. Temporal sampling is disjoint, as in PyG.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar.loader.disjoint import Subtrees
from pyg_sar.loader.hetero_batch import hetero_batch
from pyg_sar.loader.shard import edge_weight
from pyg_sar.loader.temporal import STRATEGIES, node_times

SUBGRAPH_TYPES = ('directional', 'bidirectional', 'induced')


def check_sampling_options(loader, subgraph_type: str, disjoint: bool,
                           time_attr: Optional[str],
                           input_time: Optional[Tensor],
                           temporal_strategy: str,
                           weight_attr: Optional[str]) -> None:
    """Checks the options and stores them on ``loader`` (with the sampling
    weight of every edge type, ``None`` where uniform)."""
    shard = loader.shard
    if subgraph_type not in SUBGRAPH_TYPES:
        raise ValueError(f"subgraph_type must be one of {SUBGRAPH_TYPES} "
                         f"(got {subgraph_type!r})")
    if temporal_strategy not in STRATEGIES:
        raise ValueError(f"temporal_strategy must be one of {STRATEGIES} "
                         f"(got {temporal_strategy!r})")
    if time_attr is not None:
        disjoint = True  # as in PyG: temporal sampling is disjoint
        if loader.replace and temporal_strategy == 'last':
            raise ValueError("temporal_strategy='last' takes the most "
                             "recent edges; it cannot sample with "
                             "replacement")
        if weight_attr is not None:
            raise ValueError(f"weight_attr={weight_attr!r} cannot be "
                             f"combined with time_attr={time_attr!r} on "
                             f"heterogeneous graphs")
    elif input_time is not None:
        raise ValueError("input_time needs time_attr (the node or edge "
                         "attribute holding the timestamps)")
    if subgraph_type == 'induced' and disjoint:
        raise ValueError("subgraph_type='induced' cannot be combined with "
                         "disjoint=True" + (" (time_attr makes sampling "
                                            "disjoint)" if time_attr else ""))
    loader.subgraph_type = subgraph_type
    loader.bidirectional = subgraph_type == 'bidirectional'
    loader.induced = subgraph_type == 'induced'
    loader.disjoint = bool(disjoint)
    loader.time_attr = time_attr
    loader.temporal_strategy = temporal_strategy
    loader.weight_attr = weight_attr
    loader.edge_weight = {e: None for e in shard.edge_types}
    if weight_attr is not None:
        with_weight = [e for e in shard.edge_types
                       if weight_attr in shard.edges[e].edge_attrs]
        if not with_weight:
            raise ValueError(
                f"weight_attr {weight_attr!r} is not an edge attribute of "
                f"any edge type of the part (PyG's stores carry none: pass "
                f"the pyg_sar HeteroPartition)")
        for e in with_weight:
            loader.edge_weight[e] = edge_weight(shard.edges[e], weight_attr)


def hetero_times(loader, time_attr: str, input_time: Optional[Tensor]
                 ) -> Tuple[Dict[Tuple, Optional[Tensor]], Tensor]:
    """``(time of every local in-edge per edge type in CSC order, None
    where not filtered; the time of every input node)``. Collective: node
    times of sources come from their owners."""
    shard = loader.shard
    node_time = {}
    for t, nodes in shard.nodes.items():
        if time_attr in nodes.node_attrs:
            node_time[t] = _one_per_row(nodes.node_attrs[time_attr],
                                        time_attr, f'{t!r} node')
    edge_time: Dict[Tuple, Optional[Tensor]] = {}
    for e, edges in shard.edges.items():
        if time_attr in edges.edge_attrs:
            edge_time[e] = _one_per_row(edges.edge_attrs[time_attr],
                                        time_attr, f'{e} edge')
        elif e[0] in node_time:  # every rank runs the same lookups
            edge_time[e] = node_times(shard.nodes[e[0]], node_time[e[0]],
                                      edges.csc_src)
        else:
            edge_time[e] = None
    if all(t is None for t in edge_time.values()):
        raise ValueError(f"time_attr {time_attr!r} is neither a node "
                         f"attribute of a source type nor an edge attribute "
                         f"of any edge type of the part")
    seeds = loader.input_nodes
    if input_time is not None:
        input_time = torch.as_tensor(input_time)
        if input_time.dim() != 1 or input_time.numel() != seeds.numel():
            raise ValueError(f"input_time must hold one time per input node "
                             f"({seeds.numel()}), got shape "
                             f"{list(input_time.shape)}")
        return edge_time, input_time
    if loader.input_type not in node_time:
        raise ValueError(f"time_attr {time_attr!r} is not a node attribute "
                         f"of the input type {loader.input_type!r}: pass "
                         f"input_time, the seeds' times")
    start = shard.nodes[loader.input_type].node_start
    return edge_time, node_time[loader.input_type][seeds - start]


def _one_per_row(value: Tensor, name: str, what: str) -> Tensor:
    if value.dim() != 1 or value.is_complex() or value.dtype == torch.bool:
        raise ValueError(f"time_attr {name!r} must be one number per "
                         f"{what} (got shape {list(value.shape)}, "
                         f"{value.dtype})")
    return value


def hetero_disjoint_round(loader, seeds: Tensor, input_id: Tensor,
                          seed_time: Optional[Tensor] = None):
    """One collective round of a heterogeneous loader with disjoint
    subtrees: a node of type ``t`` is a pair (subtree, id), so a node
    reached from two seeds appears once in each subtree; every node type
    gets ``batch`` (each node's subtree, i.e. its seed's position). With
    ``seed_time`` every edge of a subtree is no later than its seed's
    time."""
    shard, input_type = loader.shard, loader.input_type
    nodes = {t: Subtrees(shard.nodes[t].num_nodes) for t in shard.node_types}
    empty = seeds.new_empty(0)
    num_seeds = seeds.numel()
    _, first_tree, _ = nodes[input_type].add(torch.arange(num_seeds), seeds)
    trees: Dict[str, List[Tensor]] = {t: [] for t in shard.node_types}
    n_id: Dict[str, List[Tensor]] = {t: [] for t in shard.node_types}
    trees[input_type].append(first_tree)
    n_id[input_type].append(seeds)
    # Per node type: (ids, subtrees, batch-local ids) of the last hop's nodes.
    frontier = {t: (empty, empty, empty) for t in shard.node_types}
    frontier[input_type] = (seeds, first_tree, torch.arange(num_seeds))
    num_sampled_nodes = {t: [num_seeds if t == input_type else 0]
                         for t in shard.node_types}
    num_sampled_edges: Dict[Tuple, List[int]] = {e: [] for e in
                                                 shard.edge_types}
    rows: Dict[Tuple, List[Tensor]] = {e: [] for e in shard.edge_types}
    cols: Dict[Tuple, List[Tensor]] = {e: [] for e in shard.edge_types}
    e_ids: Dict[Tuple, List[Tensor]] = {e: [] for e in shard.edge_types}
    for hop in range(loader.num_hops):
        times = None if seed_time is None else {
            t: seed_time[f[1]].to(seed_time.dtype) for t, f in
            frontier.items()}
        sampled = loader._exchange_hop({t: f[0] for t, f in frontier.items()},
                                       hop, times)
        starts = {t: n.count for t, n in nodes.items()}
        new: Dict[str, List[Tuple[Tensor, Tensor]]] = {
            t: [] for t in shard.node_types}
        for e in shard.edge_types:
            src, _, dst = e
            _, sources, edge_ids, per_entry = sampled[e]
            ids, tree, local = frontier[dst]
            entry = torch.repeat_interleave(torch.arange(ids.numel()),
                                            per_entry)
            row, new_tree, new_ids = nodes[src].add(tree[entry], sources)
            new[src].append((new_tree, new_ids))
            rows[e].append(row)
            cols[e].append(local[entry])
            e_ids[e].append(edge_ids)
            num_sampled_edges[e].append(edge_ids.numel())
        for t in shard.node_types:
            new_tree = torch.cat([a for a, _ in new[t]]) if new[t] else empty
            new_ids = torch.cat([b for _, b in new[t]]) if new[t] else empty
            trees[t].append(new_tree)
            n_id[t].append(new_ids)
            frontier[t] = (new_ids, new_tree,
                           torch.arange(starts[t], nodes[t].count))
            num_sampled_nodes[t].append(new_ids.numel())
    cat = {t: torch.cat(p) if p else empty for t, p in n_id.items()}
    edge_index = {e: torch.stack([torch.cat(rows[e]), torch.cat(cols[e])])
                  if rows[e] else torch.empty(2, 0, dtype=torch.long)
                  for e in shard.edge_types}
    e_id = {e: torch.cat(e_ids[e]) if e_ids[e] else empty
            for e in shard.edge_types}
    batch = {t: torch.cat(p) if p else empty for t, p in trees.items()}
    return hetero_batch(loader, cat, edge_index, e_id, input_type, input_id,
                        num_sampled_nodes, num_sampled_edges, batch=batch,
                        seed_time=seed_time)
