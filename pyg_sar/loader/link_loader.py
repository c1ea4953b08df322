"""Link-level mini-batches of a partitioned graph: PyG's
``LinkNeighborLoader`` on collectives.

A batch takes ``batch_size`` labelled pairs of this rank, adds negatives
drawn over the node ids of the whole graph (not one part), samples the
neighborhoods of all endpoints with :class:`DistNeighborLoader`'s collective
round, and lays the result out as PyG's ``LinkNeighborLoader`` does.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch_geometric.data import Data

from pyg_sar.loader.label_pairs import check_label_pairs
from pyg_sar.loader.neighbor_loader import DistNeighborLoader
from pyg_sar.loader.options import (LINK_ORDER, PYG_LINK_ORDER,
                                    check_world, constructor_signature,
                                    resolve)
from pyg_sar.loader.sampling.negatives import (draw_negatives, earliest_node,
                                               negative_sampling,
                                               temporal_negatives)
from pyg_sar.loader.seeds import (owned_dataset_ids, to_partition_ids,
                                  to_partition_order)


class DistLinkNeighborLoader(DistNeighborLoader):
    r"""Mini-batches of labelled node pairs and their sampled neighborhoods,
    drawn collectively by all ranks; PyG's ``LinkNeighborLoader`` (and
    ``torch_geometric.distributed.DistLinkNeighborLoader``) on a partition
    made by :func:`pyg_sar.partition_graph`.

    Every rank may pass the same labelled pairs (PyG's
    ``edge_label_index``, in dataset ids): each keeps the pairs whose
    destination it owns, then the ranks balance them (same rules as
    :class:`DistNeighborLoader`: every rank yields the same number of
    batches by default; ``pad_batches=True``/``False`` opt out). With
    ``ids='partition'`` each rank passes its own pairs in partition ids
    (any owners), as before. A batch is laid out as
    ``LinkNeighborLoader``'s:

    - ``n_id``: the pairs' distinct endpoints (positives and negatives,
      sorted by id) first, then the nodes new in each hop; ``e_id``,
      ``edge_index``, ``num_sampled_nodes``, ``num_sampled_edges`` and every
      node and edge attribute as in :class:`DistNeighborLoader`;
    - ``n_id`` and ``e_id`` in dataset ids (``ids='partition'``: the
      partition's), as :class:`DistNeighborLoader`'s;
    - ``input_id``: the pairs' positions in :obj:`edge_label_index` (for
      ``None``: the dataset's edge ids of this rank's in-edges);
    - binary negative sampling (or none): ``edge_label_index`` (batch-local
      ids, positives then negatives) and ``edge_label`` (the given labels,
      or ones, then zeros for the negatives);
    - triplet negative sampling: ``src_index``, ``dst_pos_index`` and
      ``dst_neg_index`` (``[num_pos]`` or ``[num_pos, amount]``).

    Negatives are drawn, as in PyG, uniformly (or with the
    ``NegativeSampling`` weights) from all ``num_nodes`` global ids, so they
    cover every part; like PyG's they may be false negatives.

    Args:
        data: This rank's :class:`pyg_sar.Partition`, or PyG's
            ``(LocalFeatureStore, LocalGraphStore)`` loaded from it.
        num_neighbors (List[int]): Fanout per hop (``-1``: all).
        edge_label_index (Tensor, optional): ``[2, num_pairs]`` pairs of
            dataset node ids (the whole graph's; with ``ids='partition'``
            this rank's pairs of partition ids). ``None``: every edge
            (each rank its in-edges).
        edge_label (Tensor, optional): One label per pair (binary or no
            negative sampling only).
        edge_label_time (Tensor, optional): One time per pair, for
            temporal link sampling with ``time_attr`` (disjoint, as in PyG:
            every endpoint's subtree is no later than its pair's time;
            negatives inherit the times; with node timestamps, negatives
            later than their pair are re-drawn as PyG does).
        disjoint (bool): PyG's disjoint link layout: one subtree per
            endpoint, ``edge_label_index`` numbering the seeds in order,
            ``batch`` the pair of every node.
        subgraph_type, device: as for :class:`DistNeighborLoader`, and so
            are PyG's RPC arguments (PyG's positional order works too).
        neg_sampling (NegativeSampling, str or dict, optional): PyG's
            negative sampling configuration (``'binary'`` or ``'triplet'``,
            ``amount``, ``src_weight``/``dst_weight`` over all global
            ids).
        neg_sampling_ratio (float, optional): PyG's deprecated shortcut for
            binary sampling with this amount.
        batch_size, shuffle, drop_last, replace, seed, transform: as for
            :class:`DistNeighborLoader`, and so are every other argument of
            PyG's ``LinkNeighborLoader`` (its positional order:
            ``edge_label_index, edge_label, edge_label_time, replace,
            subgraph_type, disjoint, temporal_strategy, neg_sampling,
            neg_sampling_ratio, time_attr, weight_attr, transform,
            transform_sampler_output, is_sorted, filter_per_worker,
            neighbor_sampler, directed``) and pyg_sar's keywords
            (``pad_batches``, ``num_workers``, ``ids``, ``node_attrs``,
            ...). ``NegativeSampling`` weights are over the dataset's ids.
    """

    def __init__(self, data: Any, num_neighbors: Sequence[int], *args: Any,
                 **kwargs: Any) -> None:
        options = resolve(type(self).__name__, args, kwargs, LINK_ORDER,
                          PYG_LINK_ORDER)
        self._label_time_arg = options.pop('edge_label_time')
        self.neg_sampling = negative_sampling(
            options.pop('neg_sampling'), options.pop('neg_sampling_ratio'))
        self._label_index_arg = options.pop('edge_label_index')
        self._label_arg = options.pop('edge_label')
        if self.neg_sampling is not None and self.neg_sampling.is_triplet() \
                and self._label_arg is not None:
            raise ValueError("'edge_label' cannot be given with triplet "
                             "negative sampling (PyG refuses it too)")
        self._setup(data, num_neighbors, **options)

    # Set-up #################################################################

    def _resolve_input_nodes(self, input_nodes: Optional[Tensor]
                             ) -> Tuple[Tensor, Tensor]:
        """The inputs are the labelled pairs: their positions are what the
        base loader batches and shuffles."""
        shard = self.shard
        index = self._label_index_arg
        if isinstance(index, (tuple, list)) and len(index) == 2 and \
                isinstance(index[1], Tensor) and \
                not isinstance(index[0], Tensor):
            raise ValueError("'edge_label_index' with an edge type needs "
                             "a heterogeneous part (this one is "
                             "homogeneous)")
        src, dst, label, positions = self._own_pairs(
            index, self._label_arg, shard, shard, shard)
        self.edge_label_index = torch.stack([src, dst])
        self.edge_label = label
        return torch.arange(src.numel()), positions

    def _own_pairs(self, index: Any, label: Optional[Tensor], src_nodes,
                   dst_nodes, edges, of: str = ''):
        """``(src, dst, label, positions)`` of this rank's labelled pairs,
        in partition ids. ``index`` ``None``: the in-edges of this rank's
        nodes (``edges``), positions their dataset edge ids (with
        ``ids='dataset'`` where the partition records them, as PyG's
        ``arange(num_edges)``), else their local positions. Dataset ids
        (``ids='dataset'``): the whole graph's pairs (every rank may pass
        the same), each rank keeping those whose destination it owns,
        positions their columns in ``index``; partition ids: this rank's
        own pairs, any owners (the old behaviour)."""
        if index is None:
            pairs = edges.local_pairs(dst_nodes.node_start,
                                      dst_nodes.num_local_nodes)
            ids = edges.orig_eids if self.ids == 'dataset' and \
                edges.orig_eids is not None else torch.arange(pairs.size(1))
            if label is not None and label.size(0) != pairs.size(1):
                raise ValueError(f"'edge_label' has {label.size(0)} entries "
                                 f"for {pairs.size(1)} pairs")
            return pairs[0], pairs[1], label, ids.clone()
        what = ("the dataset's ids" if self.ids == 'dataset' else
                "the partition's ids")
        limits = [(nodes.num_nodes, what) for nodes in (src_nodes,
                                                         dst_nodes)]
        pairs = check_label_pairs(index, limits, label, of=of)
        if self.ids == 'partition':
            return pairs[0], pairs[1], label, torch.arange(pairs.size(1))
        check_world(self.shard)  # before the collective translation
        hit, dst = owned_dataset_ids(pairs[1], dst_nodes.orig_ids,
                                     dst_nodes.node_start)
        positions = hit.nonzero().view(-1)
        src = to_partition_ids(pairs[0, positions], src_nodes.orig_ids,
                               src_nodes.node_start)
        return src, dst, None if label is None else label[positions], \
            positions

    def _input_columns(self) -> Dict[str, Tensor]:
        columns = dict(src=self.edge_label_index[0],
                       dst=self.edge_label_index[1],
                       positions=self.input_positions)
        if self.edge_label is not None:
            columns['label'] = self.edge_label
        if self.seed_time is not None:
            columns['time'] = self.seed_time
        return columns

    def _set_input_columns(self, columns: Dict[str, Tensor]) -> None:
        self.edge_label_index = torch.stack([columns['src'],
                                             columns['dst']])
        self.input_positions = columns['positions']
        self.input_nodes = torch.arange(self.input_positions.numel())
        if self.edge_label is not None:
            self.edge_label = columns['label']
        if self.seed_time is not None:
            self.seed_time = columns['time']

    def _balance(self, counts) -> None:
        super()._balance(counts)
        neg = self.neg_sampling
        if self.ids == 'dataset' and neg is not None:
            for end in ('src', 'dst'):  # weights over the dataset's ids
                weight = getattr(neg, f'{end}_weight')
                if weight is not None:
                    nodes = self._endpoint_nodes(end)
                    setattr(neg, f'{end}_weight', to_partition_order(
                        torch.as_tensor(weight), nodes.orig_ids))

    def _endpoint_nodes(self, end: str):
        return self.shard

    def _seed_times(self, input_time, node_time) -> Optional[Tensor]:
        """Temporal link sampling: the time of every pair."""
        times = self._label_time_arg
        if times is None:
            raise ValueError("temporal link sampling (time_attr) needs "
                             "edge_label_time, one time per pair")
        times = torch.as_tensor(times)
        given = self._label_index_arg is not None
        expected = _num_pairs(self._label_index_arg) if given else \
            self.edge_label_index.size(1)
        if times.dim() != 1 or times.numel() != expected:
            raise ValueError(f"edge_label_time must hold one time per pair "
                             f"({expected}), got shape "
                             f"{list(times.shape)}")
        return times[self.input_positions] if given else times

    def _extra_config(self) -> Dict[str, Any]:
        neg = self.neg_sampling
        return dict(neg_sampling=None if neg is None else (
            neg.mode.value, float(neg.amount), neg.src_weight is not None,
            neg.dst_weight is not None))

    # One batch ##############################################################

    def _negatives(self, num: int, endpoint: str,
                   own: Optional[Tensor] = None) -> Tensor:
        """``num`` node ids drawn over the whole graph (PyG's
        ``NegativeSampling.sample``, from this loader's generator); with
        node timestamps, none later than its pair's time (PyG's greedy
        re-draws; collective)."""
        if self.node_time is not None and own is not None:
            times = self.seed_time[own]
            repeats = math.ceil(self.neg_sampling.amount)
            seed_time = times.repeat(repeats)[:num] if times.numel() else \
                times[:0]
            return temporal_negatives(
                self.shard, self.node_time,
                lambda n: self._negatives(n, endpoint), seed_time,
                self._earliest_node)
        return draw_negatives(num, self.shard.num_nodes,
                              getattr(self.neg_sampling, f'{endpoint}_weight'),
                              self.generator, endpoint, 'global node')

    def _earliest_node(self) -> int:
        """A node with the smallest time (collective once, then kept)."""
        if not hasattr(self, '_earliest'):
            self._earliest = earliest_node(self.shard, self.node_time)
        return self._earliest

    def _labelled_pairs(self, own: Tensor
                        ) -> Tuple[Tensor, Tensor, Optional[Tensor], int,
                                   int]:
        """``(src, dst, label, num_pos, num_neg)`` of the pairs at
        positions ``own``: the positives, then their negatives (binary:
        source and destination drawn, labels zero; triplet: destinations
        only, no labels)."""
        src, dst = self.edge_label_index[:, own]
        num_pos = src.numel()
        label = None
        neg = self.neg_sampling
        if neg is None or neg.is_binary():
            label = self.edge_label[own] if self.edge_label is not None \
                else None
        num_neg = 0
        if neg is not None:
            num_neg = math.ceil(num_pos * neg.amount)
            if neg.is_binary():
                src = torch.cat([src, self._negatives(num_neg, 'src', own)])
                dst = torch.cat([dst, self._negatives(num_neg, 'dst', own)])
                if label is None:
                    label = torch.ones(num_pos)
                label = torch.cat(
                    [label, label.new_zeros((num_neg, *label.shape[1:]))])
            else:
                dst = torch.cat([dst, self._negatives(num_neg, 'dst', own)])
        return src, dst, label, num_pos, num_neg

    def _batch(self, own: Tensor) -> Data:
        src, dst, label, num_pos, num_neg = self._labelled_pairs(own)
        neg = self.neg_sampling
        if self.disjoint:
            return self._disjoint_batch(own, src, dst, label, num_pos,
                                        num_neg)
        seeds, inverse = torch.cat([src, dst]).unique(return_inverse=True)
        batch = self._sample_round(seeds, own)
        del batch.batch_size
        if neg is not None and neg.is_triplet():
            batch.src_index = inverse[:num_pos]
            batch.dst_pos_index = inverse[num_pos:2 * num_pos]
            batch.dst_neg_index = self._neg_index(inverse[2 * num_pos:],
                                                  num_pos)
        else:
            batch.edge_label_index = inverse.view(2, -1)
            if label is not None:
                batch.edge_label = label
        return batch

    def _neg_index(self, index: Tensor, num_pos: int) -> Tensor:
        if num_pos:
            return index.view(num_pos, -1).squeeze(-1)
        amount = math.ceil(self.neg_sampling.amount)
        return index.new_empty((0, ) if amount == 1 else (0, amount))

    def _disjoint_batch(self, own: Tensor, src: Tensor, dst: Tensor,
                        label: Optional[Tensor], num_pos: int,
                        num_neg: int) -> Data:
        """PyG's disjoint link layout: every endpoint (positives, then
        negatives) grows its own subtree; ``batch`` is the pair of each
        node; with temporal sampling every subtree is no later than its
        pair's time."""
        neg = self.neg_sampling
        seed_time = None
        if self.seed_time is not None:
            times = self.seed_time[own]
            if neg is not None and neg.is_triplet():
                src_time = times
                dst_time = times.repeat(1 + math.ceil(neg.amount))[
                    :dst.numel()]
            else:
                src_time = dst_time = times.repeat(
                    1 + math.ceil(neg.amount if neg is not None else 0))[
                        :num_pos + num_neg]
            seed_time = torch.cat([src_time, dst_time])
        batch = self._disjoint_round(torch.cat([src, dst]), own, seed_time)
        del batch.batch_size
        if 'seed_time' in batch:
            del batch.seed_time
            batch.edge_label_time = src_time
        batch.batch = batch.batch % max(num_pos, 1)
        if neg is not None and neg.is_triplet():
            batch.src_index = torch.arange(num_pos)
            batch.dst_pos_index = torch.arange(num_pos, 2 * num_pos)
            rest = torch.arange(2 * num_pos, src.numel() + dst.numel())
            batch.dst_neg_index = self._neg_index(
                rest.view(-1, num_pos).t().reshape(-1) if num_pos else rest,
                num_pos)
        else:
            total = num_pos + num_neg
            batch.edge_label_index = torch.arange(2 * total).view(2, -1)
            if label is not None:
                batch.edge_label = label
        return batch

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(rank={self.rank}/'
                f'{self.world_size}, num_neighbors={self.num_neighbors}, '
                f'num_pairs={self.edge_label_index.size(1)}, '
                f'neg_sampling={self.neg_sampling}, '
                f'batch_size={self.batch_size}, '
                f'num_batches={self.num_batches})')

def _num_pairs(index: Any) -> int:
    if isinstance(index, (tuple, list)) and len(index) == 2 and \
            not isinstance(index[0], Tensor) and not isinstance(
                index[0], (int, list)):
        index = index[1]  # (edge type, pairs)
    if isinstance(index, (tuple, list)):
        return len(index[0])
    return int(index.size(1))


DistLinkNeighborLoader.__signature__ = constructor_signature(
    DistLinkNeighborLoader, LINK_ORDER, PYG_LINK_ORDER)
