"""PyG's ``HGTLoader`` on a partitioned heterogeneous graph, on
collectives (:class:`DistHGTLoader`).

Every rank builds its own batches from its own seeds, as
:class:`~pyg_sar.loader.DistNeighborLoader` does, with the same inputs
(whole-graph masks, dataset ids, balancing), epochs (``num_workers``) and
batch layout (dataset ids); what differs is how the nodes are drawn:
HGSampling (:mod:`pyg_sar.loader.sampling.hgt`), whose budget updates ask
the owners of the sampled nodes for their in-edges, one collective hop per
iteration; the batch is then the subgraph induced on the sampled nodes
(:mod:`pyg_sar.loader.sampling.induced`).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

import torch
from torch import Tensor
from torch_geometric.data import HeteroData

from pyg_sar.loader.batches.hetero_data import hetero_batch
from pyg_sar.loader.hetero_neighbor_loader import DistHeteroNeighborLoader
from pyg_sar.loader.options import (HGT_ORDER, agree_with_peers,
                                    constructor_signature,
                                    count_batches_and_seed, resolve,
                                    store_batch_options,
                                    store_sampling_options,
                                    typed_num_samples)
from pyg_sar.loader.sampling.hgt import hgt_sample, in_neighbors
from pyg_sar.loader.sampling.neighborhood import BatchIds
from pyg_sar.loader.sampling.temporal import pick_times
from pyg_sar.loader.shards.base import schema
from pyg_sar.loader.shards.hetero_shard import HeteroShard, to_hetero_shard
from pyg_sar.loader.shards.stores import is_hetero


class DistHGTLoader(DistHeteroNeighborLoader):
    r"""Mini-batches of a partitioned heterogeneous graph drawn by
    HGSampling, the sampler of the `"Heterogeneous Graph Transformer"
    <https://arxiv.org/abs/2003.01332>`_ paper: PyG's
    :class:`torch_geometric.loader.HGTLoader` (same arguments, same
    positional order, same batches' layout), with no torch_sparse.

    Every node type keeps a budget of the nodes adjacent to the sampled
    ones: a sampled node ``w`` adds ``1 / deg(w)`` to each source of its
    in-edges of every edge type not sampled yet (``deg``: its in-degree
    over that edge type; a node with more than 50 in-edges of a type
    feeds 50 of them, drawn uniformly, ``1 / 50`` each, as
    ``torch_sparse`` does). Starting from the seeds, iteration ``i``
    draws, per node type ``t``, ``num_samples[t][i]`` budget nodes without
    replacement in proportion to their budget squared (all of them when
    there are no more), and their neighbors enter the budgets
    (:mod:`pyg_sar.loader.sampling.hgt`). A node's in-edges are read on
    its owner rank, so the budgets are those of the whole graph at every
    world size; each rank samples its own seeds' batch.

    Collective: every rank builds one (with equal settings, checked) and
    iterates it to the end, as :class:`~pyg_sar.loader.DistNeighborLoader`
    (whose rules, balancing and ``num_workers`` apply). Every batch is a
    :class:`~torch_geometric.data.HeteroData` laid out as PyG's
    ``HGTLoader`` batches:

    - per node type: every node attribute (``num_nodes`` for a type
      without any), rows in ``n_id`` order; ``n_id``: the dataset ids of
      the type's sampled nodes (the seeds first on the input type, then
      every iteration's draws; empty for a type with none, which PyG
      leaves without ``n_id``);
    - per edge type: the subgraph induced on the sampled nodes, every edge
      of the whole graph between them (``edge_index`` in batch-local ids,
      by destination then as stored; ``e_id``: dataset edge ids; every edge
      attribute). ``torch_sparse`` looks at 50 random in-edges of a
      destination with more (and then gives wrong ``e_id``); here every
      edge is kept;
    - on the input type: ``batch_size`` and ``input_id`` (the seeds'
      positions in :obj:`input_nodes`), and ``seed_time`` with
      :obj:`input_time`, as PyG.

    Args:
        data (HeteroPartition or (LocalFeatureStore, LocalGraphStore)):
            This rank's heterogeneous part (PyG's ``HGTLoader`` takes no
            homogeneous graph, neither does this).
        num_samples (List[int] or Dict[str, List[int]]): Nodes to draw per
            iteration, the same for every node type or per node type (every
            type, all lists as long); the length is the number of
            iterations.
        input_nodes (str or (str, Tensor)): The seeds' node type, alone
            (every node of it) or with a boolean mask over the whole
            graph's nodes of the type or their dataset ids (every rank keeps
            those it owns), as for
            :class:`~pyg_sar.loader.DistHeteroNeighborLoader`.
        is_sorted, filter_per_worker: PyG's; no effect.
        transform (Callable, optional): Applied to every batch.
        transform_sampler_output (Callable, optional): Applied to the
            sampler's :class:`~torch_geometric.sampler.HeteroSamplerOutput`
            (partition ids, as for
            :class:`~pyg_sar.loader.DistHeteroNeighborLoader`).
        **kwargs: PyG's ``NodeLoader``/DataLoader keywords (``input_time``,
            ``batch_size``, ``shuffle``, ``drop_last``, ``num_workers``,
            ``persistent_workers``, ``prefetch_factor``, ``generator``,
            ``worker_init_fn``, ...) and pyg_sar's keyword-only ``seed``,
            ``pad_batches``, ``device``, ``ids``, ``node_attrs``, all as for
            :class:`~pyg_sar.loader.DistNeighborLoader`.

    Memory: besides its part, every rank holds two ``int32`` maps over the
    global ids of every node type (8 bytes per node); the budgets are
    O(batch).
    """

    def __init__(self, data: Any, num_samples: Union[List[int],
                                                      Dict[str, List[int]]],
                 *args: Any, **kwargs: Any) -> None:
        self._setup(data, num_samples, **resolve(
            type(self).__name__, args, kwargs, HGT_ORDER, HGT_ORDER))

    def _setup(self, data: Any, num_samples: Any, input_nodes: Any = None,
               transform: Optional[Callable] = None,
               transform_sampler_output: Optional[Callable] = None, *,
               input_time: Optional[Tensor] = None, batch_size: int = 1,
               shuffle: bool = False, drop_last: bool = False,
               num_workers: int = 0, prefetch_factor: Optional[int] = None,
               generator: Optional[torch.Generator] = None,
               worker_init_fn: Optional[Callable[[int], None]] = None,
               seed: Optional[int] = None,
               pad_batches: Optional[bool] = None,
               device: Optional[torch.device] = None,
               ids: Optional[str] = None,
               node_attrs: Optional[List[str]] = None) -> None:
        if not is_hetero(data):
            raise ValueError(f"DistHGTLoader samples heterogeneous graphs "
                             f"only, as PyG's HGTLoader (got "
                             f"{type(data).__name__}, not a heterogeneous "
                             f"part; use DistNeighborLoader)")
        self.data = data
        self.shard: HeteroShard = to_hetero_shard(data)
        self.num_samples = typed_num_samples(num_samples,
                                             self.shard.node_types)
        store_batch_options(self, batch_size, shuffle, drop_last, False,
                            transform, pad_batches, device,
                            transform_sampler_output, num_workers,
                            prefetch_factor, worker_init_fn)
        # The batch is the induced subgraph of the sampled nodes.
        store_sampling_options(self, 'induced', False, None, None,
                               'uniform')
        self._setup_inputs(ids, node_attrs, input_nodes)
        # PyG's HGTLoader hands input_time to the batch as seed_time.
        self.seed_time = pick_times(input_time, self.input_positions)
        counts = self._agree_with_peers()
        self._balance(counts)
        count_batches_and_seed(self, seed, generator, counts)
        self.batch_ids = {t: BatchIds(n.num_nodes)
                          for t, n in self.shard.nodes.items()}
        self._epoch_running = False
        self._pending = None

    def _agree_with_peers(self) -> List[int]:
        shard = self.shard
        options = dict(
            partition=shard.fingerprint, attributes=shard.schema(),
            num_samples=tuple((t, tuple(n))
                              for t, n in self.num_samples.items()),
            pad_batches=self.pad_mode, batch_size=self.batch_size,
            drop_last=self.drop_last, ids=self.ids, fetched=tuple(
                (t, tuple(schema(v))) for t, v in self.node_sources.items()),
            input_type=self.input_type,
            input_time=self.seed_time is not None)
        return agree_with_peers(shard, options,
                                int(self.input_nodes.numel()),
                                type(self).__name__)

    def _sample_round(self, seeds: Tensor, input_id: Tensor) -> HeteroData:
        """HGSampling from ``seeds`` (possibly none) while serving the
        peers' budget requests, then the induced subgraph and its
        attributes (collective)."""
        n_id, _ = hgt_sample({self.input_type: seeds}, self.batch_ids,
                             self.num_samples, self._in_neighbors,
                             self.generator)
        none = {e: torch.empty(2, 0, dtype=torch.long)
                for e in self.shard.edge_types}
        return hetero_batch(
            self, n_id, none, {e: v[0] for e, v in none.items()},
            self.input_type, input_id, None, None,
            seed_time=None if self.seed_time is None
            else self.seed_time[input_id])

    def _in_neighbors(self, new: Dict[str, Tensor]):
        return in_neighbors(self.shard, new, self.rank, self.world_size,
                            self.generator)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(rank={self.rank}/'
                f'{self.world_size}, num_samples={self.num_samples}, '
                f'input_type={self.input_type!r}, '
                f'num_seeds={self.input_nodes.numel()}, '
                f'batch_size={self.batch_size}, '
                f'num_batches={self.num_batches}, '
                f'num_global_batches={self.num_global_batches})')


DistHGTLoader.__signature__ = constructor_signature(
    DistHGTLoader, HGT_ORDER, HGT_ORDER, second='num_samples')
