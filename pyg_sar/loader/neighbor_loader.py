"""A distributed neighbor loader on collectives (no RPC, no compiled code).

Every rank owns one part of a graph partitioned by
:func:`pyg_sar.partition_graph`: a contiguous range of global node ids, the
in-edges of those nodes (CSC) and their features. One iteration step is one
*collective round* in which every rank takes part:

1. ``all_reduce`` of the number of batches each rank still has; when it is
   zero everywhere, the epoch ends on all ranks at once.
2. Per hop: the frontier node ids travel to their owners (``all_to_all``),
   owners sample from their local CSC with the vectorized kernel of
   :mod:`pyg_sar.loader.sampling.kernel` and reply with the sampled
   ``(count per target, source ids, edge ids)`` (``all_to_all``).
3. After the last hop, every rank requests the node (and edge) attributes it
   lacks from their owners, and receives them in one exchange.

By default the ranks' inputs are balanced when the loader is built
(:mod:`pyg_sar.loader.balance`), so every rank has the same number of
batches. With ``pad_batches=False`` (opt-in) a rank whose own batches are
finished sends empty requests but keeps answering its peers until every
rank is done, so ranks may have different numbers of batches, or none at
all. The epoch's rounds run in the training thread or, with
``num_workers > 0``, ahead of it in a background thread
(:mod:`pyg_sar.loader.epoch`).

The rounds are built from the pieces the heterogeneous loader uses too
(:mod:`pyg_sar.loader.sampling`, :mod:`pyg_sar.loader.batches`), this graph
being their one-type case.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import torch
from torch import Tensor

from torch_geometric.data import Data

from pyg_sar import comm
from pyg_sar.loader.balance import rebalance
from pyg_sar.loader.batches.attributes import fetch_plan
from pyg_sar.loader.batches.data import data_batch
from pyg_sar.loader.epoch import start_epoch, uneven_hint
from pyg_sar.loader.options import (NODE_ORDER, PYG_NODE_ORDER,
                                    agree_with_peers, check_num_neighbors,
                                    check_world, constructor_signature,
                                    count_batches_and_seed, resolve,
                                    store_batch_options,
                                    store_sampling_options)
from pyg_sar.loader.seeds import epoch_batches, ids_mode, input_seeds
from pyg_sar.loader.sampling.disjoint import grow_subtrees
from pyg_sar.loader.sampling.exchange import answer, exchange_hop
from pyg_sar.loader.sampling.neighborhood import BatchIds, grow
from pyg_sar.loader.sampling.temporal import (edge_times, pick_times,
                                              seed_times)
from pyg_sar.loader.shards.base import EDGE, NODE, edge_weight, schema
from pyg_sar.loader.shards.shard import to_shard
from pyg_sar.loader.shards.stores import is_hetero

# The positions of a round in which a rank only answers its peers.
_NO_SEEDS = torch.empty(0, dtype=torch.long)


class DistNeighborLoader:
    r"""Mini-batches of sampled neighborhoods of a partitioned graph, drawn
    collectively by all ranks: PyG's
    :class:`torch_geometric.loader.NeighborLoader` (same arguments, same
    positional order, same batches' layout and ids) and
    :class:`torch_geometric.distributed.DistNeighborLoader` (its call too),
    with no RPC and no pyg-lib.

    Collective: every rank builds one (with equal settings, checked) and
    every rank iterates it. Every batch is a
    :class:`~torch_geometric.data.Data` laid out like
    :class:`torch_geometric.loader.NeighborLoader`'s:

    - every node attribute of the graph (``x``, ``y``, masks, ...; those of
      :obj:`node_attrs`) with rows in ``n_id`` order, and every edge
      attribute with rows in ``e_id`` order;
    - ``edge_index`` in batch-local ids, messages flowing from sampled
      neighbor (``edge_index[0]``) to target (``edge_index[1]``);
    - ``n_id``: the *dataset's* node ids (those of the graph given to
      :func:`~pyg_sar.partition_graph`), the ``batch_size`` seeds first,
      then the nodes new in hop 1, hop 2, ..., so ``x_all[batch.n_id]``
      is ``batch.x`` for the whole graph's ``x_all`` at every world size;
      ``e_id``: the dataset's edge ids (columns of its ``edge_index``; a
      partition written before pyg_sar recorded them gives no ``e_id``);
      with ``ids='partition'`` (and PyG's stores, which carry no dataset
      ids) both are the partition's relabelled ids instead;
    - ``input_id``: the seeds' positions in :obj:`input_nodes` (for a mask
      or ``None``, the seeds' ids, as PyG's ``input_id =
      mask.nonzero()``), as in PyG (for ``ids='partition'`` ids: in the
      input of the rank that was given the seed, which balancing may
      move);
      ``batch_size``;
    - ``num_sampled_nodes`` (per hop, seeds first) and ``num_sampled_edges``
      (per hop).

    **Every rank yields the same number of batches** (the default,
    ``pad_batches=None``): the ranks count their inputs when the loader is
    built and move the surplus of the ranks above an even share to those
    below (only the surplus moves; sampling is collective, so a rank may
    batch seeds it does not own; :mod:`pyg_sar.loader.balance`). An epoch
    has ``ceil(total / (world_size * batch_size))`` batches on every rank
    (``floor`` with :obj:`drop_last`), each of at most :obj:`batch_size`
    seeds; a rank whose share needs fewer chunks of :obj:`batch_size`
    splits it evenly. No batch is empty unless there are fewer inputs than
    ``world_size`` times the number of batches (then the ranks short of
    seeds yield empty batches, ``batch_size == 0``), so a stock
    ``F.cross_entropy(out[:batch.batch_size], ...)`` and a gradient
    all-reduce per step work on every rank, also on a rank that owns no
    input node. At world size 1 the batches are PyG's (chunks of
    :obj:`batch_size`, the last smaller). ``pad_batches=True``: no
    balancing, each rank batches its own inputs and pads with empty
    batches up to :attr:`num_global_batches`; ``pad_batches=False``
    (opt-in): no balancing, no padding, the ranks' batch counts differ;
    a rank whose batches are finished answers its peers' rounds inside its
    last ``next()``, so never call a collective inside such a loop (a
    peer failure then names the counts and ``pad_batches``).

    Leaving a loop early (``break``, ``close()``) is collective too: at
    its next operation of :mod:`pyg_sar.comm` (or the next epoch) the rank
    first answers its peers' remaining rounds, so a peer that goes on
    iterating gets all its batches; a rank that exits on an exception does
    not wait (its peers fail fast, naming it). The loaders' traffic runs on
    its own channel (:func:`pyg_sar.comm.on_channel`): an iterator left
    open on one rank while it calls a collective makes both sides fail at
    the timeout with a :class:`~pyg_sar.comm.PeerError` naming the other
    rank, so a loop body that calls collectives must leave the loop at the
    same step on every rank.

    Args:
        data (pyg_sar.Partition or (LocalFeatureStore, LocalGraphStore)):
            This rank's part, from :func:`pyg_sar.load_partition` or PyG's
            stores loaded with ``from_partition(root, rank)`` from a pyg_sar
            partition (the stores carry node attributes only, and no
            dataset ids). Kept as :attr:`data`.
        num_neighbors (List[int]): Fanout per hop; ``-1`` takes all
            in-edges. Each target gets ``min(in_degree, fanout)`` distinct
            in-edges per hop (``fanout`` when :obj:`replace`).
        input_nodes (Tensor, optional): Seeds, as PyG takes them: a boolean
            mask over the whole graph (e.g. ``data.train_mask``, the same on
            every rank) or dataset node ids (any rank's; a repeated id is
            a seed at every occurrence, as in PyG); every rank keeps the
            seeds it owns (then balancing moves the surplus). A mask over the part's nodes (e.g.
            ``part.train_mask``) works too; where the two lengths coincide
            (one part), a mask that is one of the part's own attributes is
            read in the part's order, any other in the dataset's. With
            ``ids='partition'``: integer ids are partition ids owned by this
            rank. ``None``: every node.
        input_time (Tensor, optional): The seeds' times, one per input node
            (default: the seeds' node times); temporal sampling only.
        replace (bool): Sample with replacement.
        subgraph_type (str): ``"directional"`` (the sampled edges),
            ``"bidirectional"`` (plus their reverses, coalesced, as PyG
            does; ``num_sampled_nodes``/``num_sampled_edges`` are then
            dropped, as in PyG) or ``"induced"`` (every edge of the graph
            between the sampled nodes; ``num_sampled_edges`` dropped).
        disjoint (bool): Every seed gets its own subtree (nodes repeat
            across subtrees); ``batch`` gives each node's seed, as in PyG.
        temporal_strategy (str): ``"uniform"`` or ``"last"`` (the most
            recent edges).
        time_attr (str, optional): Temporal sampling (always disjoint, as
            in PyG): a node or edge attribute of timestamps; every edge
            sampled in a seed's subtree is no later than the seed's time
            (:mod:`pyg_sar.loader.sampling.temporal`).
        weight_attr (str, optional): An edge attribute of the part: edges
            are sampled in proportion to it (zero: never), as PyG's
            ``weight_attr``.
        transform (Callable[[Data], Data], optional): Applied to every batch.
        transform_sampler_output (Callable, optional): Applied, as in PyG,
            to the sampler's output before the attributes are fetched: a
            :class:`~torch_geometric.sampler.SamplerOutput` whose ``node``
            and ``edge`` are *partition* ids (as the samplers of
            ``torch_geometric.distributed`` give), ``row``/``col``
            batch-local, ``metadata`` ``(input_id, seed_time)``. It may
            keep, drop or reorder nodes and edges (not add edges that were
            not sampled); the batch is then built from what it returns.
        is_sorted, filter_per_worker: PyG's; no effect.
        neighbor_sampler: Refused (pyg_sar samples collectively).
        directed (bool): PyG's deprecated spelling: ``False`` is
            ``subgraph_type='induced'``, with PyG's warning.
        batch_size (int): Seeds per batch (at most; see above).
        shuffle (bool): Shuffle this rank's seeds every epoch.
        drop_last (bool): Only full batches (see above).
        num_workers (int): ``0``: the rounds run in the training thread;
            ``> 0``: one background thread runs them ahead (sampling,
            fetch, collation, :obj:`transform`), at most
            ``num_workers * prefetch_factor`` batches, with exactly the
            batches of ``0`` (:mod:`pyg_sar.loader.epoch`). Sampling is a
            collective, so there is one such thread however large the
            number (no worker processes).
        prefetch_factor (int, optional): Batches in flight per worker
            (default 2), as torch's DataLoader.
        generator (torch.Generator, optional): Draws :obj:`seed` (as it
            seeds torch's DataLoader).
        worker_init_fn (Callable[[int], None], optional): Called with ``0``
            in the background thread before its first round
            (``num_workers > 0``; never with ``num_workers=0``, as in
            torch's DataLoader).
        collate_fn: Dropped, as PyG's loaders drop it.
        seed (int, optional): pyg_sar's: seed of shuffling and sampling;
            with the same seed and world size, epochs are reproduced
            exactly. ``None`` (and no :obj:`generator`) draws one from
            torch's global generator.
        pad_batches (bool, optional): pyg_sar's: ``None`` (balanced, the
            default), ``True`` or ``False`` (see above).
        device (torch.device, optional): pyg_sar's: batches are moved there.
        ids (str, optional): pyg_sar's: ``"dataset"`` (the default for a
            pyg_sar part) or ``"partition"`` (the partition's relabelled
            ids, in :obj:`input_nodes` and in the batches; the only ones of
            PyG's stores).
        node_attrs (List[str], optional): pyg_sar's: the node attributes a
            batch fetches (default all; ``[]`` none, e.g. for layer-wise
            inference that reads ``x_all[batch.n_id]``).
        **kwargs: PyG's distributed arguments (:mod:`pyg_sar.loader.options`):
            ``master_addr``, ``master_port``, ``current_ctx`` (its rank and
            world size must match the process group), ``concurrency``,
            ``num_rpc_threads``, ``async_sampling`` configure PyG's RPC and
            have no effect here; ``dist_sampler``, ``sampler`` and
            ``batch_sampler`` are refused; ``pin_memory``,
            ``persistent_workers``, ``timeout``, ``multiprocessing_context``
            have no effect.

    PyG's distributed call, argument for argument, also works:
    ``DistNeighborLoader(data, num_neighbors, master_addr, master_port,
    current_ctx, input_nodes, ...)`` (a string third argument selects its
    positional order).

    Attributes: :attr:`data` (the part given), :attr:`dataset` (this
    rank's inputs after balancing, a ``range`` as PyG's loaders iterate),
    :attr:`num_batches`, :attr:`num_global_batches` (the most of any rank).

    Memory: besides its part, two ``int32`` maps over the ``num_nodes``
    global ids (8 bytes per node) relabel a batch in O(batch); dataset ids
    travel with the attributes, never through a map of the whole graph.

    A heterogeneous part (or PyG's heterogeneous stores) makes a
    :class:`~pyg_sar.loader.DistHeteroNeighborLoader`, which yields
    :class:`~torch_geometric.data.HeteroData` batches.
    """

    # The heterogeneous loader subclasses this one, so it registers here when
    # imported (pyg_sar.loader imports it) instead of being imported.
    _kinds: Dict[str, type] = {}

    def __new__(cls, *args: Any, **kwargs: Any) -> 'DistNeighborLoader':
        # A homogeneous loader class given a heterogeneous part makes its
        # heterogeneous subclass (registered under the class's name).
        target = DistNeighborLoader._kinds.get(cls.__name__)
        if target is not None and target is not cls and \
                is_hetero(args[0] if args else kwargs.get('data')):
            return super().__new__(target)
        return super().__new__(cls)

    def __init__(self, data: Any, num_neighbors: Sequence[int], *args: Any,
                 **kwargs: Any) -> None:
        self._setup(data, num_neighbors, **resolve(
            type(self).__name__, args, kwargs, NODE_ORDER, PYG_NODE_ORDER))

    def _setup(self, data: Any, num_neighbors: Sequence[int],
               input_nodes: Optional[Tensor] = None,
               input_time: Optional[Tensor] = None, replace: bool = False,
               subgraph_type: str = 'directional', disjoint: bool = False,
               temporal_strategy: str = 'uniform',
               time_attr: Optional[str] = None,
               weight_attr: Optional[str] = None,
               transform: Optional[Callable[[Data], Data]] = None,
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
        self.shard = to_shard(data)
        self.num_neighbors = check_num_neighbors(num_neighbors)
        store_batch_options(self, batch_size, shuffle, drop_last, replace,
                            transform, pad_batches, device,
                            transform_sampler_output, num_workers,
                            prefetch_factor, worker_init_fn)
        store_sampling_options(self, subgraph_type, disjoint, time_attr,
                               input_time, temporal_strategy)
        self.weight_attr = weight_attr
        self.edge_weight = edge_weight(self.shard, weight_attr)
        self.rank = self.shard.rank
        self.world_size = self.shard.num_parts
        self.ids = ids_mode(ids, self.shard.orig_ids)
        fetch_plan(self, node_attrs)
        self.input_nodes, self.input_positions = \
            self._resolve_input_nodes(input_nodes)
        check_world(self.shard)
        counts = self._agree_with_peers()
        self.edge_time = self.seed_time = self.node_time = None
        if time_attr is not None:  # collective (node times of sources)
            self.edge_time, self.node_time = edge_times(self.shard, time_attr)
            self.seed_time = self._seed_times(input_time, self.node_time)
        self._balance(counts)
        count_batches_and_seed(self, seed, generator, counts)
        # Global id -> batch-local id of the batch being built.
        self.batch_ids = {NODE: BatchIds(self.shard.num_nodes)}
        self._epoch_running = False
        self._pending = None

    # Set-up #################################################################

    def _resolve_input_nodes(self, input_nodes: Optional[Tensor]):
        """``(seeds, positions)`` of this rank's inputs
        (:func:`~pyg_sar.loader.seeds.input_seeds`)."""
        shard = self.shard
        if input_nodes is not None and not isinstance(
                input_nodes, (Tensor, list, tuple)):
            raise TypeError(f"'input_nodes' must be a boolean mask or a "
                            f"tensor of node ids (got "
                            f"{type(input_nodes).__name__})")

        # PyG: a mask's input_id is the seeds' node ids (mask.nonzero()).
        self.input_is_mask = isinstance(input_nodes, Tensor) and \
            input_nodes.dtype == torch.bool
        def owner(bad: int) -> str:
            return (f'rank {int(shard.owner(torch.tensor([bad]))[0])}'
                    if 0 <= bad < shard.num_nodes else 'no rank')
        return input_seeds(input_nodes, shard.node_start,
                           shard.num_local_nodes, shard.num_nodes,
                           shard.orig_ids, self.ids, self.rank, 'global',
                           'part.train_mask',
                           list(shard.node_attrs.values()), owner)

    def _input_columns(self) -> Dict[str, Tensor]:
        """One row per input of this rank, what balancing moves."""
        columns = dict(nodes=self.input_nodes,
                       positions=self.input_positions)
        if self.seed_time is not None:
            columns['time'] = self.seed_time
        return columns

    def _set_input_columns(self, columns: Dict[str, Tensor]) -> None:
        self.input_nodes = columns['nodes']
        self.input_positions = columns['positions']
        if self.seed_time is not None:
            self.seed_time = columns['time']

    def _balance(self, counts: List[int]) -> None:
        """Moves the surplus inputs of the ranks above their share to those
        below (:mod:`~pyg_sar.loader.balance`; collective), by default."""
        if self.balanced and self.world_size > 1:
            self._set_input_columns(rebalance(self._input_columns(), counts,
                                              self.rank))

    def _agree_with_peers(self) -> List[int]:
        """Checks that all ranks are configured alike (collective) and
        returns every rank's number of inputs."""
        shard = self.shard
        options = dict(
            partition=shard.fingerprint,
            num_neighbors=tuple(self.num_neighbors), replace=self.replace,
            pad_batches=self.pad_mode, batch_size=self.batch_size,
            drop_last=self.drop_last, ids=self.ids,
            fetched=tuple((t, tuple(schema(v)))
                          for t, v in self.node_sources.items()),
            node_attributes=schema(shard.node_attrs),
            edge_attributes=schema(shard.edge_attrs),
            subgraph_type=self.subgraph_type, weight_attr=self.weight_attr,
            disjoint=self.disjoint, time_attr=self.time_attr,
            temporal_strategy=self.temporal_strategy, **self._extra_config())
        return agree_with_peers(shard, options,
                                int(self.input_nodes.numel()),
                                type(self).__name__)

    def _extra_config(self) -> Dict[str, Any]:
        """Further options every rank must share, ``{name: value}``
        (subclasses)."""
        return {}

    # Iteration ##############################################################

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        return self.num_global_batches if self.pad_batches else \
            self.num_batches

    @property
    def dataset(self) -> range:
        """This rank's inputs (after balancing), as the ``range`` PyG's
        loaders iterate (``len(loader.dataset)``: how many this rank
        batches per epoch, before ``drop_last``)."""
        return range(int(self.input_nodes.numel()))

    def __iter__(self) -> Iterator[Data]:
        if self._epoch_running and self._pending is None and \
                self.world_size > 1:
            raise RuntimeError(
                'a new epoch was started while an iterator of the previous '
                'one is still open on this rank (neither exhausted nor '
                'closed); its peers would wait forever. Iterate it to the '
                'end or close it (a for loop closes it at break)')
        return start_epoch(self, self._own_batches())

    def _seed_times(self, input_time: Optional[Tensor],
                    node_time: Optional[Tensor]) -> Optional[Tensor]:
        """The time of every input (temporal sampling)."""
        return seed_times(self.input_nodes, self.shard.node_start,
                          pick_times(input_time, self.input_positions),
                          node_time,
                          "time_attr is an edge attribute: pass input_time, "
                          "the seeds' times")

    def _batch(self, own: Tensor) -> Data:
        """The batch of the inputs at positions ``own`` (collective)."""
        return self._sample_round(self.input_nodes[own], own)

    def _finish_epoch(self) -> None:
        """Answers the peers' requests, with no seeds of this rank, until no
        rank has batches left (an epoch left early)."""
        while self._round(None, 0) is not None:
            pass

    def _own_batches(self) -> List[Tensor]:
        """This rank's input positions of the epoch, one tensor per batch
        (:func:`~pyg_sar.loader.seeds.epoch_batches`)."""
        num_inputs = self.input_nodes.numel()
        positions = torch.arange(num_inputs)
        if self.shuffle:
            positions = torch.randperm(num_inputs, generator=self.generator)
        return epoch_batches(positions, self.num_batches, self.batch_size,
                             self.drop_last)

    def _round(self, own: Optional[Tensor], remaining: int) -> Optional[Data]:
        """One collective round on the loaders' channel: the batch of the
        positions ``own`` (``None``: no seeds, only the peers' requests
        answered), or ``None`` when no rank has batches left (``remaining``:
        this rank's)."""
        try:
            with comm.on_channel('loader'):
                left = torch.tensor([max(remaining, 0)], dtype=torch.long)
                if int(comm.all_reduce(left, 'sum')[0]) == 0:
                    return None
                return self._batch(_NO_SEEDS if own is None else own)
        except comm.PeerError as error:
            raise uneven_hint(self, error) from error

    # One collective round ###################################################

    def _sample_round(self, seeds: Tensor, input_id: Tensor) -> Data:
        """Samples the neighborhood of ``seeds`` (possibly none) while
        serving the peers' requests, and fetches its attributes."""
        if self.disjoint:
            seed_time = None if self.seed_time is None else \
                self.seed_time[input_id]
            return self._disjoint_round(seeds, input_id, seed_time)
        n_id, edge_index, e_id, num_sampled_nodes, num_sampled_edges = grow(
            {NODE: seeds}, self.batch_ids, [EDGE], len(self.num_neighbors),
            self._hop)
        return data_batch(self, n_id[NODE], edge_index[EDGE], e_id[EDGE],
                          input_id, int(seeds.numel()),
                          num_sampled_nodes[NODE], num_sampled_edges[EDGE])

    def _disjoint_round(self, seeds: Tensor, input_id: Tensor,
                        seed_time: Optional[Tensor] = None) -> Data:
        """One round with disjoint subtrees; the batch has ``batch`` (each
        node's subtree, i.e. its seed's position in the batch). With
        ``seed_time`` (temporal sampling) every subtree's edges are no later
        than its seed's time."""
        n_id, edge_index, e_id, trees, num_sampled_nodes, num_sampled_edges \
            = grow_subtrees(seeds, NODE, {NODE: self.shard.num_nodes},
                            [EDGE], len(self.num_neighbors), self._hop,
                            seed_time)
        extra = {'batch': trees[NODE]}
        if seed_time is not None:
            extra['seed_time'] = seed_time
        return data_batch(self, n_id[NODE], edge_index[EDGE], e_id[EDGE],
                          input_id, int(seeds.numel()),
                          num_sampled_nodes[NODE], num_sampled_edges[EDGE],
                          **extra)

    def _hop(self, frontier: Dict[str, Tensor], hop: int,
             frontier_time: Optional[Dict[str, Tensor]] = None):
        """One collective hop of the frontier (and its seeds' times, for
        temporal sampling):
        :func:`~pyg_sar.loader.sampling.exchange.exchange_hop` with this
        graph's one edge type."""
        shard, fanout, ids = self.shard, self.num_neighbors[hop], \
            frontier[NODE]

        def serve(_, asked: Tensor, times: Optional[Tensor]):
            return answer(shard, asked - shard.node_start, fanout,
                          self.replace, self.generator, self.edge_weight,
                          times, self.edge_time, self.temporal_strategy)
        sampled, = exchange_hop(
            [ids], [shard.owner(ids)], serve, self.rank, self.world_size,
            None if frontier_time is None else [frontier_time[NODE]])
        return {EDGE: sampled}

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(rank={self.rank}/'
                f'{self.world_size}, num_neighbors={self.num_neighbors}, '
                f'num_seeds={self.input_nodes.numel()}, '
                f'batch_size={self.batch_size}, '
                f'num_batches={self.num_batches}, '
                f'num_global_batches={self.num_global_batches})')


DistNeighborLoader.__signature__ = constructor_signature(
    DistNeighborLoader, NODE_ORDER, PYG_NODE_ORDER)
