"""Link-level mini-batches of a heterogeneous partitioned graph: PyG's
``LinkNeighborLoader`` on heterogeneous data, on collectives.

:class:`~pyg_sar.loader.DistLinkNeighborLoader` given a heterogeneous part
builds a :class:`DistHeteroLinkNeighborLoader`: the labelled pairs are of
one edge type ``(src, rel, dst)``; negatives are drawn over every node of
the ``src`` (binary) and ``dst`` type of the whole graph (all parts); the
neighborhoods of the endpoints are sampled with the heterogeneous loader's
collective round, seeds of both endpoint types at once.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.data import HeteroData

from pyg_sar.loader.batches.hetero_data import hetero_batch
from pyg_sar.loader.hetero_neighbor_loader import DistHeteroNeighborLoader
from pyg_sar.loader.link_loader import DistLinkNeighborLoader
from pyg_sar.loader.neighbor_loader import DistNeighborLoader
from pyg_sar.loader.options import (LINK_ORDER, PYG_LINK_ORDER,
                                    constructor_signature)
from pyg_sar.loader.sampling.negatives import draw_negatives


class DistHeteroLinkNeighborLoader(DistHeteroNeighborLoader,
                                   DistLinkNeighborLoader):
    r"""Link batches of a heterogeneous part; built by
    :class:`~pyg_sar.loader.DistLinkNeighborLoader` when :obj:`data` is
    heterogeneous (same call, same collective rules). A batch is a
    :class:`~torch_geometric.data.HeteroData` laid out as PyG's
    heterogeneous ``LinkNeighborLoader`` batches:

    - per node type ``n_id`` (the distinct endpoints of that type first,
      sorted by id; one set when source and destination types are the
      same), ``num_sampled_nodes``, every node attribute; per edge type
      ``edge_index``, ``e_id``, ``num_sampled_edges``, every edge attribute
      (as :class:`~pyg_sar.loader.DistHeteroNeighborLoader`);
    - on the input edge type: ``input_id`` (the pairs' positions in
      :obj:`edge_label_index`); binary (or no) negative sampling:
      ``edge_label_index`` (batch-local ids of the source and destination
      types, positives then negatives) and ``edge_label`` (the labels or
      ones, then zeros);
    - triplet negative sampling: ``src_index`` on the source type,
      ``dst_pos_index`` and ``dst_neg_index`` on the destination type.

    Args:
        edge_label_index ((EdgeType, Tensor) or EdgeType): The pairs'
            edge type (a ``(src, rel, dst)`` tuple or ``'src__rel__dst'``)
            with ``[2, num_pairs]`` dataset ids of the source and
            destination types (every rank may pass the same; each keeps the
            pairs whose destination it owns; ``ids='partition'``: this
            rank's pairs of partition ids); the edge type alone (or with
            ``None``): every edge of the type (each rank its in-edges).

    The other arguments (``edge_label``, ``neg_sampling``,
    ``neg_sampling_ratio``, ``batch_size``, ``shuffle``, ``drop_last``,
    ``replace``, ``seed``, ``transform``, ``pad_batches``, ``device``,
    ``subgraph_type``, ``weight_attr``) are as for
    :class:`~pyg_sar.loader.DistLinkNeighborLoader` and
    :class:`~pyg_sar.loader.DistHeteroNeighborLoader`;
    ``NegativeSampling`` weights are over the ids of the endpoint's node
    type.

    ``disjoint`` and temporal link sampling (``time_attr``,
    ``edge_label_time``) are refused on heterogeneous parts.
    """

    def _setup(self, data: Any, num_neighbors: Any, **options: Any) -> None:
        if options.get('disjoint'):
            raise ValueError("DistLinkNeighborLoader: disjoint=True is not "
                             "supported for heterogeneous graphs")
        if options.get('time_attr') is not None or \
                self._label_time_arg is not None:
            raise ValueError("DistLinkNeighborLoader: temporal link sampling "
                             "(time_attr, edge_label_time) is not supported "
                             "for heterogeneous graphs")
        super()._setup(data, num_neighbors, **options)

    def _resolve_hetero_input(self, input_nodes: Any
                              ) -> Tuple[Tuple[str, str, str], Tensor,
                                         Tensor]:
        shard = self.shard
        index = self._label_index_arg
        edge_type, pairs = index, None
        if isinstance(index, (tuple, list)) and len(index) == 2:
            edge_type, pairs = index
        edge_type = self._edge_type(edge_type)
        src_t, _, dst_t = edge_type
        src, dst, label, positions = self._own_pairs(
            pairs, self._label_arg, shard.nodes[src_t], shard.nodes[dst_t],
            shard.edges[edge_type], of=f' of edge type {edge_type}')
        self.edge_label_index = torch.stack([src, dst])
        self.edge_label = label
        return edge_type, torch.arange(src.numel()), positions

    def _endpoint_nodes(self, end: str):
        return self.shard.nodes[self.input_type[0 if end == 'src' else 2]]

    def _edge_type(self, key: Any) -> Tuple[str, str, str]:
        types = self.shard.edge_types
        if isinstance(key, str):
            key = tuple(key.split('__'))
        if isinstance(key, list):
            key = tuple(key)
        if key not in types:
            raise ValueError(f"'edge_label_index' of a heterogeneous graph "
                             f"must be an edge type or an (edge type, "
                             f"pairs) pair, edge type one of {types} (got "
                             f"{key!r})")
        return key

    def _negatives(self, num: int, endpoint: str,
                   own: Optional[Tensor] = None) -> Tensor:
        """``num`` ids drawn over every node of the endpoint's type (all
        parts), uniformly or with the ``NegativeSampling`` weights."""
        node_type = self.input_type[0 if endpoint == 'src' else 2]
        return draw_negatives(num, self.shard.nodes[node_type].num_nodes,
                              getattr(self.neg_sampling, f'{endpoint}_weight'),
                              self.generator, endpoint, f'{node_type!r} node')

    def _batch(self, own: Tensor) -> HeteroData:
        src_t, _, dst_t = edge_type = self.input_type
        src, dst, label, num_pos, _ = self._labelled_pairs(own)
        neg = self.neg_sampling
        seeds: Dict[str, Tensor] = {}
        if src_t == dst_t:
            ids, inverse = torch.cat([src, dst]).unique(return_inverse=True)
            seeds[src_t] = ids
            src_index, dst_index = inverse[:src.numel()], \
                inverse[src.numel():]
        else:
            seeds[src_t], src_index = src.unique(return_inverse=True)
            seeds[dst_t], dst_index = dst.unique(return_inverse=True)
        sample = self._sample_typed(seeds)
        batch = hetero_batch(self, *sample[:3], edge_type, own, *sample[3:])
        if neg is not None and neg.is_triplet():
            batch[src_t].src_index = src_index
            batch[dst_t].dst_pos_index = dst_index[:num_pos]
            batch[dst_t].dst_neg_index = self._neg_index(
                dst_index[num_pos:], num_pos)
        else:
            batch[edge_type].edge_label_index = torch.stack([src_index,
                                                             dst_index])
            if label is not None:
                batch[edge_type].edge_label = label
        return batch

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(rank={self.rank}/'
                f'{self.world_size}, num_neighbors={self.num_neighbors}, '
                f'edge_type={self.input_type}, '
                f'num_pairs={self.edge_label_index.size(1)}, '
                f'neg_sampling={self.neg_sampling}, '
                f'batch_size={self.batch_size}, '
                f'num_batches={self.num_batches})')


DistNeighborLoader._kinds['DistLinkNeighborLoader'] = \
    DistHeteroLinkNeighborLoader

DistHeteroLinkNeighborLoader.__signature__ = constructor_signature(
    DistHeteroLinkNeighborLoader, LINK_ORDER, PYG_LINK_ORDER)
