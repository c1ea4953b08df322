"""Neighbor sampling of heterogeneous graphs on collectives.

:class:`pyg_sar.loader.DistNeighborLoader` given a heterogeneous part (a
:class:`pyg_sar.partition.HeteroPartition`, or PyG's
heterogeneous stores loaded from a pyg_sar partition) builds a
:class:`DistHeteroNeighborLoader`. Sampling follows PyG's heterogeneous
semantics: the seeds are nodes of one type; at every hop, for every edge
type ``(src, rel, dst)`` in the graph's order, each ``dst`` node that was new
in the previous hop gets up to ``fanout[edge type][hop]`` in-edges of that
type, and the sources not sampled before become the ``src`` nodes of this
hop, in order of first appearance.

One collective round per batch, as in the homogeneous loader: per hop one
``all_to_all`` of the frontier of every edge type to its owners and one of
their answers; then one exchange of all node and edge attributes.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.loader.batch_parts import (_INT32_MAX, _first_seen_absent,
                                        _group_by_owner)
from pyg_sar.loader.hetero_batch import hetero_batch
from pyg_sar.loader.hetero_options import (check_sampling_options,
                                           hetero_disjoint_round,
                                           hetero_times)
from pyg_sar.loader.hetero_shard import EdgeType, HeteroShard, to_hetero_shard
from pyg_sar.loader.neighbor_loader import (DistNeighborLoader,
                                            _check_num_neighbors)
from pyg_sar.loader.options import (NODE_ORDER, PYG_NODE_ORDER,
                                    agree_with_peers, constructor_signature,
                                    count_batches_and_seed, local_seeds,
                                    store_batch_options)
from pyg_sar.loader.sampler import _ranges, sample_neighbors
from pyg_sar.loader.temporal import sample_temporal


class DistHeteroNeighborLoader(DistNeighborLoader):
    r"""Mini-batches of sampled neighborhoods of a partitioned heterogeneous
    graph; built by :class:`~pyg_sar.loader.DistNeighborLoader` when
    :obj:`data` is heterogeneous (same call, same collective rules:
    every rank builds one with equal settings and iterates it to the end).

    Every batch is a :class:`~torch_geometric.data.HeteroData` laid out like
    the heterogeneous batches of
    :class:`torch_geometric.loader.NeighborLoader`:

    - per node type: every node attribute of the type (``x``, ``y``,
      masks, ...) with rows in ``n_id`` order (``num_nodes`` for a type
      without attributes); ``n_id``: the nodes' global ids in the
      *partition's* per-type numbering (as the homogeneous loader's
      ``n_id``; ``part[t].orig_ids`` / ``perm/<type>.pt`` map them to input
      ids); ``num_sampled_nodes``: new nodes per hop, hop 0 being the seeds
      (``batch_size`` for the input type, ``0`` for the others);
    - per edge type: ``edge_index`` in batch-local ids of the source and
      destination types, messages flowing from ``edge_index[0]`` to
      ``edge_index[1]``; ``e_id``: the partition's per-type edge ids;
      every edge attribute, rows in ``e_id`` order; ``num_sampled_edges``
      per hop;
    - on the input type: ``batch_size`` seeds, which come first in its
      ``n_id``, and ``input_id``, their positions in :obj:`input_nodes`.

    Args:
        data (HeteroPartition or (LocalFeatureStore, LocalGraphStore)):
            This rank's part.
        num_neighbors (List[int] or Dict[EdgeType, List[int]]): Fanout per
            hop, the same for every edge type, or per edge type (keys
            ``(src, rel, dst)`` tuples or ``'src__rel__dst'`` strings; every
            edge type needs one, all with the same number of hops; PyG's
            ``NumNeighbors`` also works). ``-1`` takes all in-edges.
        input_nodes (str or (str, Tensor)): The seeds' node type, alone
            (every local node of it) or with a boolean mask over the type's
            local nodes (e.g. ``part['paper'].train_mask``) or the type's
            global ids owned by this rank, each at most once.
        batch_size, shuffle, drop_last, replace: As for the homogeneous loader.
        seed, transform, pad_batches, device: As for the homogeneous loader.

        subgraph_type (str): ``"directional"``, ``"bidirectional"``
            (PyG's ``HeteroSamplerOutput.to_bidirectional`` of the sample:
            an edge type merged with its reverse type loses ``e_id`` and
            its edge attributes, and per-hop counts are dropped, as in
            PyG) or ``"induced"`` (every edge of every type between the
            sampled nodes; ``num_sampled_edges`` dropped).
        disjoint (bool): Every seed grows its own subtree; every node type
            gets ``batch``, each node's seed position.
        time_attr (str, optional): Temporal (and so disjoint) sampling: a
            node attribute (an edge's time is its source node's) or an edge
            attribute; an edge type with neither is not time-filtered.
            Every edge of a seed's subtree is no later than the seed's time
            (``seed_time`` on the input type).
        input_time (Tensor, optional): One time per input node (default:
            their node times).
        temporal_strategy (str): ``"uniform"`` or ``"last"``.
        weight_attr (str, optional): An edge attribute: edge types holding
            it are sampled in proportion to it, the others uniformly (not
            with :obj:`time_attr`).

    These options live in :mod:`pyg_sar.loader.hetero_options`.

    Memory: besides its part, every rank holds two ``int32`` maps over the
    global ids of every node type (8 bytes per node).
    """

    def _setup(self, data: Any, num_neighbors: Any,
               input_nodes: Any = None, batch_size: int = 1,
               shuffle: bool = False, drop_last: bool = False,
               replace: bool = False, seed: Optional[int] = None,
               transform: Optional[Callable] = None,
               pad_batches: bool = False,
               subgraph_type: str = 'directional',
               device: Optional[torch.device] = None,
               weight_attr: Optional[str] = None,
               disjoint: bool = False, time_attr: Optional[str] = None,
               input_time: Optional[Tensor] = None,
               temporal_strategy: str = 'uniform') -> None:
        self.shard: HeteroShard = to_hetero_shard(data)
        self.num_neighbors = _hetero_num_neighbors(num_neighbors,
                                                   self.shard.edge_types)
        self.num_hops = len(next(iter(self.num_neighbors.values()), []))
        store_batch_options(self, batch_size, shuffle, drop_last, replace,
                            transform, pad_batches, device)
        check_sampling_options(self, subgraph_type, disjoint, time_attr,
                               input_time, temporal_strategy, weight_attr)
        self.rank = self.shard.rank
        self.world_size = self.shard.num_parts
        self.input_type, self.input_nodes = self._resolve_hetero_input(
            input_nodes)
        count_batches_and_seed(self, seed)
        self.num_global_batches = self._agree_with_peers()
        self.edge_time = self.seed_time = None
        if time_attr is not None:  # collective (node times of sources)
            self.edge_time, self.seed_time = hetero_times(self, time_attr,
                                                          input_time)
        # Per node type: global id -> batch-local id (-1: absent), and the
        # scratch map of `_first_seen_absent`.
        self._local_index = {
            t: torch.full((n.num_nodes, ), -1, dtype=torch.int32)
            for t, n in self.shard.nodes.items()}
        self._first_position = {
            t: torch.full((n.num_nodes, ), _INT32_MAX, dtype=torch.int32)
            for t, n in self.shard.nodes.items()}
        self._epoch_running = False

    def _resolve_hetero_input(self, input_nodes: Any) -> Tuple[str, Tensor]:
        types = self.shard.node_types
        if isinstance(input_nodes, str):
            input_nodes = (input_nodes, None)
        if not (isinstance(input_nodes, (tuple, list)) and
                len(input_nodes) == 2 and isinstance(input_nodes[0], str)):
            raise ValueError(f"'input_nodes' of a heterogeneous graph must be "
                             f"a node type or a (node type, mask or ids) "
                             f"pair, node type one of {types} (got "
                             f"{type(input_nodes).__name__})")
        node_type, nodes = input_nodes
        if node_type not in self.shard.nodes:
            raise ValueError(f"'input_nodes' names node type {node_type!r}, "
                             f"which the graph lacks (node types: {types})")
        shard = self.shard.nodes[node_type]
        start, count = shard.node_start, shard.num_local_nodes
        if nodes is None:
            return node_type, torch.arange(start, start + count)
        if isinstance(nodes, (list, tuple)):
            nodes = torch.as_tensor(nodes, dtype=torch.long)
        if not isinstance(nodes, Tensor) or nodes.dim() != 1:
            raise TypeError(f"'input_nodes' of type {node_type!r} must be a "
                            f"one-dimensional boolean mask over the local "
                            f"{node_type!r} nodes or tensor of their global "
                            f"ids (got {type(nodes).__name__})")
        return node_type, local_seeds(nodes, start, count, self.rank,
                                      repr(node_type),
                                      f'part[{node_type!r}].train_mask')

    def _agree_with_peers(self) -> int:
        shard = self.shard
        options = dict(
            partition=shard.fingerprint, attributes=shard.schema(),
            num_neighbors=tuple((e, tuple(f))
                                for e, f in self.num_neighbors.items()),
            replace=self.replace, pad_batches=self.pad_batches,
            input_type=self.input_type, subgraph_type=self.subgraph_type,
            disjoint=self.disjoint, weight_attr=self.weight_attr,
            time_attr=self.time_attr,
            temporal_strategy=self.temporal_strategy, **self._extra_config())
        return agree_with_peers(shard, options, self.num_batches,
                                type(self).__name__)

    # One collective round ###################################################

    def _sample_round(self, seeds: Tensor, input_id: Tensor):
        if self.disjoint:
            seed_time = None if self.seed_time is None else \
                self.seed_time[input_id]
            return hetero_disjoint_round(self, seeds, input_id, seed_time)
        sample = self._sample_typed({self.input_type: seeds})
        return hetero_batch(self, *sample[:3], self.input_type, input_id,
                            *sample[3:])

    def _sample_typed(self, seeds: Dict[str, Tensor]):
        """Samples the neighborhoods of the distinct ``seeds`` of one or
        more node types (collective); returns ``(n_id, edge_index, e_id,
        num_sampled_nodes, num_sampled_edges)`` per type."""
        shard, index = self.shard, self._local_index
        empty = torch.empty(0, dtype=torch.long)
        n_id_parts: Dict[str, List[Tensor]] = {t: [] for t in
                                               shard.node_types}
        num_nodes = {t: 0 for t in shard.node_types}
        for t, ids in seeds.items():
            n_id_parts[t].append(ids)
            index[t][ids] = torch.arange(ids.numel(), dtype=torch.int32)
            num_nodes[t] = ids.numel()
        num_sampled_nodes = {t: [num_nodes[t]] for t in shard.node_types}
        num_sampled_edges: Dict[EdgeType, List[int]] = {
            e: [] for e in shard.edge_types}
        rows: Dict[EdgeType, List[Tensor]] = {e: [] for e in
                                              shard.edge_types}
        cols: Dict[EdgeType, List[Tensor]] = {e: [] for e in
                                              shard.edge_types}
        e_ids: Dict[EdgeType, List[Tensor]] = {e: [] for e in
                                               shard.edge_types}
        frontier = {t: seeds.get(t, empty) for t in shard.node_types}
        try:
            for hop in range(self.num_hops):
                sampled = self._exchange_hop(frontier, hop)
                new: Dict[str, List[Tensor]] = {t: [] for t in
                                                shard.node_types}
                for e in shard.edge_types:
                    src, _, dst = e
                    targets, sources, edge_ids, _ = sampled[e]
                    fresh = _first_seen_absent(sources, index[src],
                                               self._first_position[src])
                    index[src][fresh] = torch.arange(
                        num_nodes[src], num_nodes[src] + fresh.numel(),
                        dtype=torch.int32)
                    num_nodes[src] += fresh.numel()
                    n_id_parts[src].append(fresh)
                    new[src].append(fresh)
                    rows[e].append(index[src][sources].long())
                    cols[e].append(index[dst][targets].long())
                    e_ids[e].append(edge_ids)
                    num_sampled_edges[e].append(edge_ids.numel())
                for t in shard.node_types:
                    frontier[t] = torch.cat(new[t]) if new[t] else empty
                    num_sampled_nodes[t].append(frontier[t].numel())
        finally:
            for t, parts in n_id_parts.items():  # leave the maps clean
                for ids in parts:
                    index[t][ids] = -1
        n_id = {t: torch.cat(p) if p else empty
                for t, p in n_id_parts.items()}
        edge_index = {e: torch.stack([torch.cat(rows[e]), torch.cat(cols[e])])
                      if rows[e] else torch.empty(2, 0, dtype=torch.long)
                      for e in shard.edge_types}
        e_id = {e: torch.cat(e_ids[e]) if e_ids[e] else empty
                for e in shard.edge_types}
        return n_id, edge_index, e_id, num_sampled_nodes, num_sampled_edges

    def _exchange_hop(self, frontier: Dict[str, Tensor], hop: int,
                      frontier_time: Optional[Dict[str, Tensor]] = None
                      ) -> Dict[EdgeType, Tuple[Tensor, Tensor, Tensor,
                                                Tensor]]:
        """Sends the frontier of every edge type's destination type to its
        owners, samples the requests this rank receives (one kernel call per
        edge type) and returns, per edge type, ``(target, source, edge id)``
        of the sampled edges, grouped by target in frontier order, and the
        number of edges of every frontier entry (repeated ids are sampled
        independently). With ``frontier_time`` (temporal sampling) every
        entry's edges are no later than its time."""
        shard, world_size, rank = self.shard, self.world_size, self.rank
        empty = torch.empty(0, dtype=torch.long)
        active = [e for e in shard.edge_types
                  if self.num_neighbors[e][hop] != 0]
        out = {e: (empty, empty, empty,
                   torch.zeros(frontier[e[2]].numel(), dtype=torch.long))
               for e in shard.edge_types}
        if not active:
            return out
        groups = []
        for e in active:
            targets = frontier[e[2]]
            order, counts = _group_by_owner(
                shard.nodes[e[2]].owner(targets), world_size)
            groups.append((targets[order], order, counts))
        # One request per peer: [count of every edge type | ids, edge type
        # by edge type].
        received = comm.all_to_all_v([torch.cat(
            [torch.tensor([c[q] for _, _, c in groups], dtype=torch.long)] +
            [ids.split(c)[q] for ids, _, c in groups])
            for q in range(world_size)])
        received_times = None
        if frontier_time is not None:  # every request carries its time
            received_times = comm.all_to_all_v([torch.cat(
                [frontier_time[e[2]][order].split(c)[q]
                 for e, (_, order, c) in zip(active, groups)])
                for q in range(world_size)])
            time_offsets = [0] * world_size

        # Serve: per edge type, every peer's requests in one kernel call.
        replies: List[List[Tensor]] = [[] for _ in range(world_size)]
        offsets = [len(active)] * world_size
        for i, e in enumerate(active):
            edges = shard.edges[e]
            start = shard.nodes[e[2]].node_start
            asked, times = [], []
            for q in range(world_size):
                count = int(received[q][i])
                asked.append(received[q][offsets[q]:offsets[q] + count])
                offsets[q] += count
                if received_times is not None:
                    times.append(received_times[q][
                        time_offsets[q]:time_offsets[q] + count])
                    time_offsets[q] += count
            fanout = self.num_neighbors[e][hop]
            if received_times is not None and \
                    self.edge_time[e] is not None:
                counts, positions = sample_temporal(
                    edges.csc_ptr, torch.cat(asked) - start,
                    torch.cat(times), fanout, self.edge_time[e],
                    self.temporal_strategy, self.replace, self.generator)
            else:
                counts, positions = sample_neighbors(
                    edges.csc_ptr, torch.cat(asked) - start, fanout,
                    self.replace, self.generator, self.edge_weight[e])
            sources = edges.csc_src[positions]
            edge_ids = edges.csc_eid[positions]
            per_peer = counts.split([a.numel() for a in asked])
            num_edges = [int(c.sum()) for c in per_peer]
            for q, (c, s, d) in enumerate(zip(per_peer,
                                              sources.split(num_edges),
                                              edge_ids.split(num_edges))):
                replies[q] += [c, s, d]
        own = replies[rank]
        answers = comm.all_to_all_v([
            torch.cat(r) if q != rank else empty
            for q, r in enumerate(replies)])

        for i, e in enumerate(active):
            requests, order, request_counts = groups[i]
            counts, sources, edge_ids = [], [], []
            for q in range(world_size):
                if q == rank:
                    c, s, d = own[3 * i:3 * i + 3]
                else:  # [counts | sources | edge ids] per edge type
                    c, s, d = _take(answers, q, request_counts[q])
                counts.append(c)
                sources.append(s)
                edge_ids.append(d)
            out[e] = _frontier_order(requests, order, torch.cat(counts),
                                     torch.cat(sources), torch.cat(edge_ids))
        return out

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(rank={self.rank}/'
                f'{self.world_size}, num_neighbors={self.num_neighbors}, '
                f'input_type={self.input_type!r}, '
                f'num_seeds={self.input_nodes.numel()}, '
                f'batch_size={self.batch_size}, '
                f'num_batches={self.num_batches}, '
                f'num_global_batches={self.num_global_batches})')


def _take(answers: List[Tensor], q: int, num_requests: int
          ) -> Tuple[Tensor, Tensor, Tensor]:
    """Reads the next ``[counts | sources | edge ids]`` block of peer
    ``q``'s answer, and drops it from ``answers[q]``."""
    answer = answers[q]
    counts = answer[:num_requests]
    num_edges = int(counts.sum())
    end = num_requests + num_edges
    sources, edge_ids = answer[num_requests:end], answer[end:end + num_edges]
    answers[q] = answer[end + num_edges:]
    return counts, sources, edge_ids


def _frontier_order(requests: Tensor, order: Tensor, counts: Tensor,
                    sources: Tensor, edge_ids: Tensor
                    ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(target, source, edge id)`` of the answers (which come in owner
    order: ``requests = frontier[order]``), moved to frontier order
    (PyG's order) without a sort, and the edge count of every frontier
    entry."""
    targets = torch.repeat_interleave(requests, counts)
    in_frontier = torch.empty_like(counts)
    in_frontier[order] = counts
    if bool((order[1:] >= order[:-1]).all()):  # already in frontier order
        return targets, sources, edge_ids, in_frontier
    slot_start = torch.cumsum(in_frontier, 0) - in_frontier
    slots = _ranges(slot_start[order], counts)
    out = [torch.empty_like(t) for t in (targets, sources, edge_ids)]
    for dst, src in zip(out, (targets, sources, edge_ids)):
        dst[slots] = src
    return out[0], out[1], out[2], in_frontier


def _hetero_num_neighbors(num_neighbors: Any, edge_types: List[EdgeType]
                          ) -> Dict[EdgeType, List[int]]:
    """The fanouts of every edge type, per hop, from a list (the same for
    every edge type), a per-edge-type dict or PyG's ``NumNeighbors``."""
    try:
        from torch_geometric.sampler.base import NumNeighbors
        if isinstance(num_neighbors, NumNeighbors):
            num_neighbors = num_neighbors.get_values(edge_types)
    except ImportError:  # pragma: no cover
        pass
    if not isinstance(num_neighbors, dict):
        fanouts = _check_num_neighbors(num_neighbors)
        return {e: list(fanouts) for e in edge_types}
    names = {'__'.join(e): e for e in edge_types}
    out: Dict[EdgeType, List[int]] = {}
    for key, value in num_neighbors.items():
        edge_type = tuple(key) if isinstance(key, (tuple, list)) else \
            names.get(key)
        if edge_type not in edge_types:
            raise ValueError(f"'num_neighbors' names edge type {key!r}, "
                             f"which the graph lacks (edge types: "
                             f"{edge_types})")
        try:
            out[edge_type] = _check_num_neighbors(value)
        except (TypeError, ValueError) as err:
            raise type(err)(f"'num_neighbors[{key!r}]': {err}") from None
    missing = [e for e in edge_types if e not in out]
    if missing:
        raise ValueError(f"'num_neighbors' misses edge types {missing}; give "
                         f"a fanout list for every edge type (or one list "
                         f"for all)")
    hops = {len(v) for v in out.values()}
    if len(hops) > 1:
        raise ValueError(f"'num_neighbors' must give every edge type the "
                         f"same number of hops (got {sorted(hops)})")
    return {e: out[e] for e in edge_types}


DistNeighborLoader._kinds['DistNeighborLoader'] = DistHeteroNeighborLoader

DistHeteroNeighborLoader.__signature__ = constructor_signature(
    DistHeteroNeighborLoader, NODE_ORDER, PYG_NODE_ORDER)
