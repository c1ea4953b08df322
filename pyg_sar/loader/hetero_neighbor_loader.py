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
their answers; then one exchange of all node and edge attributes. The
rounds are built from the same pieces as the homogeneous loader's
(:mod:`pyg_sar.loader.sampling`, :mod:`pyg_sar.loader.batches`).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar.loader.batches.hetero_data import hetero_batch
from pyg_sar.loader.neighbor_loader import DistNeighborLoader
from pyg_sar.loader.batches.attributes import fetch_plan
from pyg_sar.loader.options import (NODE_ORDER, PYG_NODE_ORDER,
                                    agree_with_peers, check_world,
                                    constructor_signature,
                                    count_batches_and_seed,
                                    store_batch_options,
                                    store_sampling_options,
                                    typed_num_neighbors)
from pyg_sar.loader.seeds import ids_mode, input_seeds
from pyg_sar.loader.sampling.disjoint import grow_subtrees
from pyg_sar.loader.sampling.exchange import answer, exchange_hop
from pyg_sar.loader.sampling.neighborhood import BatchIds, grow
from pyg_sar.loader.sampling.temporal import (pick_times, seed_times,
                                              typed_edge_times)
from pyg_sar.loader.shards.base import edge_weight, schema
from pyg_sar.loader.shards.hetero_shard import (EdgeType, HeteroShard,
                                                to_hetero_shard)


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
      without attributes); ``n_id``: the nodes' *dataset* ids of that type
      (``x_dict[t][batch[t].n_id]`` is ``batch[t].x``; the partition's
      per-type ids with ``ids='partition'`` or PyG's stores);
      ``num_sampled_nodes``: new nodes per hop, hop 0 being the seeds
      (``batch_size`` for the input type, ``0`` for the others);
    - per edge type: ``edge_index`` in batch-local ids of the source and
      destination types, messages flowing from ``edge_index[0]`` to
      ``edge_index[1]``; ``e_id``: the dataset's per-type edge ids (the
      partition's with ``ids='partition'``);
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
            (every node of it) or with a boolean mask over the whole
            graph's nodes of the type (e.g. ``data['paper'].train_mask``)
            or the type's dataset ids, as PyG takes them (every rank keeps
            those it owns; a repeated id is a seed at every occurrence); a mask over the part's nodes of the type (e.g.
            ``part['paper'].train_mask``) works too. ``input_id`` is the
            seeds' positions in the ids (for a mask, the seeds' ids), as
            in PyG.
        others: Every other argument (PyG's order and keywords,
            balancing, ``num_workers``, ``transform_sampler_output`` (given
            a :class:`~torch_geometric.sampler.HeteroSamplerOutput` in
            partition ids), ``ids``, ``node_attrs``, ...) is as for the
            homogeneous :class:`~pyg_sar.loader.DistNeighborLoader`; in
            particular the following.
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

    Memory: besides its part, every rank holds two ``int32`` maps over the
    global ids of every node type (8 bytes per node).
    """

    def _setup(self, data: Any, num_neighbors: Any,
               input_nodes: Any = None, input_time: Optional[Tensor] = None,
               replace: bool = False, subgraph_type: str = 'directional',
               disjoint: bool = False, temporal_strategy: str = 'uniform',
               time_attr: Optional[str] = None,
               weight_attr: Optional[str] = None,
               transform: Optional[Callable] = None,
               transform_sampler_output: Optional[Callable] = None, *,
               batch_size: int = 1, shuffle: bool = False,
               drop_last: bool = False, num_workers: int = 0,
               prefetch_factor: Optional[int] = None,
               generator: Optional[torch.Generator] = None,
               worker_init_fn: Optional[Callable[[int], None]] = None,
               seed: Optional[int] = None,
               pad_batches: Optional[bool] = None,
               device: Optional[torch.device] = None,
               ids: Optional[str] = None,
               node_attrs: Optional[List[str]] = None) -> None:
        self.data = data
        self.shard: HeteroShard = to_hetero_shard(data)
        self.num_neighbors = typed_num_neighbors(num_neighbors,
                                                 self.shard.edge_types)
        self.num_hops = len(next(iter(self.num_neighbors.values()), []))
        store_batch_options(self, batch_size, shuffle, drop_last, replace,
                            transform, pad_batches, device,
                            transform_sampler_output, num_workers,
                            prefetch_factor, worker_init_fn)
        store_sampling_options(self, subgraph_type, disjoint, time_attr,
                               input_time, temporal_strategy)
        self.weight_attr = weight_attr
        self.edge_weight = self._edge_weights(weight_attr)
        self._setup_inputs(ids, node_attrs, input_nodes)
        counts = self._agree_with_peers()
        self.edge_time = self.seed_time = None
        if time_attr is not None:  # collective (node times of sources)
            self.edge_time, node_time = typed_edge_times(self.shard,
                                                         time_attr)
            self.seed_time = seed_times(
                self.input_nodes, self.shard.nodes[self.input_type].node_start,
                pick_times(input_time, self.input_positions),
                node_time.get(self.input_type),
                f"time_attr {time_attr!r} is not a node attribute of the "
                f"input type {self.input_type!r}: pass input_time, the "
                f"seeds' times")
        self._balance(counts)
        count_batches_and_seed(self, seed, generator, counts)
        # Per node type: global id -> batch-local id of the batch being
        # built.
        self.batch_ids = {t: BatchIds(n.num_nodes)
                          for t, n in self.shard.nodes.items()}
        self._epoch_running = False
        self._pending = None

    def _edge_weights(self, weight_attr: Optional[str]
                      ) -> Dict[EdgeType, Optional[Tensor]]:
        """The sampling weight of every edge type (``None``: uniform)."""
        shard = self.shard
        weights: Dict[EdgeType, Optional[Tensor]] = {
            e: None for e in shard.edge_types}
        if weight_attr is None:
            return weights
        if self.time_attr is not None:
            raise ValueError(f"weight_attr={weight_attr!r} cannot be "
                             f"combined with time_attr={self.time_attr!r} "
                             f"on heterogeneous graphs")
        with_weight = [e for e in shard.edge_types
                       if weight_attr in shard.edges[e].edge_attrs]
        if not with_weight:
            raise ValueError(
                f"weight_attr {weight_attr!r} is not an edge attribute of "
                f"any edge type of the part (PyG's stores carry none: pass "
                f"the pyg_sar HeteroPartition)")
        for e in with_weight:
            weights[e] = edge_weight(shard.edges[e], weight_attr)
        return weights

    def _setup_inputs(self, ids: Optional[str],
                      node_attrs: Optional[List[str]],
                      input_nodes: Any) -> None:
        """Rank, ids mode, attribute fetch plan and this rank's seeds of
        the input type (shared with :class:`~pyg_sar.loader.DistHGTLoader`)."""
        self.rank = self.shard.rank
        self.world_size = self.shard.num_parts
        orig = [n.orig_ids for n in self.shard.nodes.values()]
        self.ids = ids_mode(ids, None if any(o is None for o in orig)
                            else orig[0] if orig else None)
        fetch_plan(self, node_attrs)
        self.input_type, self.input_nodes, self.input_positions = \
            self._resolve_hetero_input(input_nodes)
        check_world(self.shard)

    def _resolve_hetero_input(self, input_nodes: Any
                              ) -> Tuple[str, Tensor, Tensor]:
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
        if nodes is not None and not isinstance(nodes, (Tensor, list,
                                                         tuple)):
            raise TypeError(f"'input_nodes' of type {node_type!r} must be a "
                            f"boolean mask or a tensor of node ids (got "
                            f"{type(nodes).__name__})")
        # PyG: a mask's input_id is the seeds' node ids (mask.nonzero()).
        self.input_is_mask = isinstance(nodes, Tensor) and \
            nodes.dtype == torch.bool
        seeds, positions = input_seeds(
            nodes, shard.node_start, shard.num_local_nodes, shard.num_nodes,
            shard.orig_ids, self.ids, self.rank, repr(node_type),
            f'part[{node_type!r}].train_mask',
            list(shard.node_attrs.values()))
        return node_type, seeds, positions

    def _agree_with_peers(self) -> List[int]:
        shard = self.shard
        options = dict(
            partition=shard.fingerprint, attributes=shard.schema(),
            num_neighbors=tuple((e, tuple(f))
                                for e, f in self.num_neighbors.items()),
            replace=self.replace, pad_batches=self.pad_mode,
            batch_size=self.batch_size, drop_last=self.drop_last,
            ids=self.ids, fetched=tuple(
                (t, tuple(schema(v))) for t, v in self.node_sources.items()),
            input_type=self.input_type, subgraph_type=self.subgraph_type,
            disjoint=self.disjoint, weight_attr=self.weight_attr,
            time_attr=self.time_attr,
            temporal_strategy=self.temporal_strategy, **self._extra_config())
        return agree_with_peers(shard, options,
                                int(self.input_nodes.numel()),
                                type(self).__name__)

    # One collective round ###################################################

    def _sample_round(self, seeds: Tensor, input_id: Tensor):
        if self.disjoint:
            seed_time = None if self.seed_time is None else \
                self.seed_time[input_id]
            n_id, edge_index, e_id, trees, num_sampled_nodes, \
                num_sampled_edges = grow_subtrees(
                    seeds, self.input_type,
                    {t: n.num_nodes for t, n in self.shard.nodes.items()},
                    self.shard.edge_types, self.num_hops, self._hop,
                    seed_time)
            return hetero_batch(self, n_id, edge_index, e_id,
                                self.input_type, input_id,
                                num_sampled_nodes, num_sampled_edges,
                                batch=trees, seed_time=seed_time)
        sample = self._sample_typed({self.input_type: seeds})
        return hetero_batch(self, *sample[:3], self.input_type, input_id,
                            *sample[3:])

    def _sample_typed(self, seeds: Dict[str, Tensor]):
        """Samples the neighborhoods of the ``seeds`` of one or
        more node types (collective); returns ``(n_id, edge_index, e_id,
        num_sampled_nodes, num_sampled_edges)`` per type."""
        return grow(seeds, self.batch_ids, self.shard.edge_types,
                    self.num_hops, self._hop)

    def _hop(self, frontier: Dict[str, Tensor], hop: int,
             frontier_time: Optional[Dict[str, Tensor]] = None
             ) -> Dict[EdgeType, Tuple[Tensor, Tensor, Tensor, Tensor]]:
        """One collective hop of every edge type whose fanout at ``hop`` is
        not 0 (:func:`~pyg_sar.loader.sampling.exchange.exchange_hop`; the
        frontier of an edge type is that of its destination type), the
        others sampling nothing. With ``frontier_time`` (temporal sampling)
        every entry's edges are no later than its time."""
        shard = self.shard
        empty = torch.empty(0, dtype=torch.long)
        active = [e for e in shard.edge_types
                  if self.num_neighbors[e][hop] != 0]
        out = {e: (empty, empty, empty,
                   torch.zeros(frontier[e[2]].numel(), dtype=torch.long))
               for e in shard.edge_types}
        if not active:
            return out

        def serve(i: int, asked: Tensor, times: Optional[Tensor]):
            e = active[i]
            return answer(shard.edges[e],
                          asked - shard.nodes[e[2]].node_start,
                          self.num_neighbors[e][hop], self.replace,
                          self.generator, self.edge_weight[e], times,
                          None if self.edge_time is None
                          else self.edge_time[e], self.temporal_strategy)
        out.update(zip(active, exchange_hop(
            [frontier[e[2]] for e in active],
            [shard.nodes[e[2]].owner(frontier[e[2]]) for e in active],
            serve, self.rank, self.world_size,
            None if frontier_time is None
            else [frontier_time[e[2]] for e in active])))
        return out

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(rank={self.rank}/'
                f'{self.world_size}, num_neighbors={self.num_neighbors}, '
                f'input_type={self.input_type!r}, '
                f'num_seeds={self.input_nodes.numel()}, '
                f'batch_size={self.batch_size}, '
                f'num_batches={self.num_batches}, '
                f'num_global_batches={self.num_global_batches})')


DistNeighborLoader._kinds['DistNeighborLoader'] = DistHeteroNeighborLoader

DistHeteroNeighborLoader.__signature__ = constructor_signature(
    DistHeteroNeighborLoader, NODE_ORDER, PYG_NODE_ORDER)
