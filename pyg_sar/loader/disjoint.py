"""Disjoint sampling (PyG's ``disjoint=True``): every seed grows its own
subtree, so a node reached from two seeds appears once in each subtree.

A node of a batch is a pair ``(subtree, global id)``, keyed
``subtree * num_nodes + id``. Each hop samples every frontier entry
independently (the collective hop of :class:`DistNeighborLoader`), and the
sources not yet in their subtree become new nodes, in order of first
appearance, as PyG orders them.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch_geometric.data import Data


def _first_appearance(keys: Tensor):
    """The distinct ``keys`` in order of first appearance, and for every key
    its index among them."""
    unique, inverse = torch.unique(keys, return_inverse=True)
    first = torch.full((unique.numel(), ), keys.numel(), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(keys.numel()),
                          reduce='amin')
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    return unique[order], rank[inverse]


def disjoint_round(loader, seeds: Tensor, input_id: Tensor,
                   seed_time: Optional[Tensor] = None) -> Data:
    """One collective round of ``loader`` (a ``DistNeighborLoader``) with
    disjoint subtrees; the batch has ``batch`` (each node's subtree, i.e.
    its seed's position in the batch). With ``seed_time`` (temporal
    sampling) every subtree's edges are no later than its seed's time."""
    num_global = loader.shard.num_nodes
    num_seeds = seeds.numel()
    trees = [torch.arange(num_seeds)]
    n_id = [seeds]
    known_keys, order = torch.sort(trees[0] * num_global + seeds)
    known_local = order
    frontier, frontier_local, frontier_tree = seeds, trees[0], trees[0]
    num_nodes = num_seeds
    rows, cols, e_ids = [], [], []
    num_sampled_nodes, num_sampled_edges = [num_seeds], []
    for fanout in loader.num_neighbors:
        _, sources, edge_ids, per_entry = loader._exchange_hop(
            frontier, fanout,
            None if seed_time is None else seed_time[frontier_tree])
        entry = torch.repeat_interleave(torch.arange(frontier.numel()),
                                        per_entry)
        keys = frontier_tree[entry] * num_global + sources
        local = torch.full_like(keys, -1)
        if known_keys.numel() and keys.numel():
            at = torch.searchsorted(known_keys, keys).clamp_(
                max=known_keys.numel() - 1)
            found = known_keys[at] == keys
            local[found] = known_local[at[found]]
        else:
            found = torch.zeros_like(keys, dtype=torch.bool)
        new_keys, position = _first_appearance(keys[~found])
        local[~found] = num_nodes + position
        new_local = torch.arange(num_nodes, num_nodes + new_keys.numel())
        num_nodes += new_keys.numel()
        new_tree, new_nodes = new_keys // num_global, new_keys % num_global
        trees.append(new_tree)
        n_id.append(new_nodes)
        known_keys, order = torch.sort(torch.cat([known_keys, new_keys]))
        known_local = torch.cat([known_local, new_local])[order]
        rows.append(local)
        cols.append(frontier_local[entry])
        e_ids.append(edge_ids)
        num_sampled_nodes.append(new_keys.numel())
        num_sampled_edges.append(edge_ids.numel())
        frontier, frontier_local, frontier_tree = new_nodes, new_local, \
            new_tree
    edge_index = torch.stack([torch.cat(rows), torch.cat(cols)]) if rows \
        else torch.empty(2, 0, dtype=torch.long)
    e_id = torch.cat(e_ids) if e_ids else torch.empty(0, dtype=torch.long)
    extra = {'batch': torch.cat(trees)}
    if seed_time is not None:
        extra['seed_time'] = seed_time
    return loader._finish(torch.cat(n_id), edge_index, e_id, input_id,
                          num_seeds, num_sampled_nodes, num_sampled_edges,
                          **extra)
