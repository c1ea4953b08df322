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


class Subtrees:
    """The nodes of one node type in a disjoint batch: pairs ``(subtree,
    global id)`` keyed ``subtree * num_global + id``, each with its
    batch-local id, in order of first appearance."""

    def __init__(self, num_global: int) -> None:
        self.num_global = max(int(num_global), 1)
        self.keys = torch.empty(0, dtype=torch.long)  # sorted
        self.local = torch.empty(0, dtype=torch.long)  # of the sorted keys
        self.count = 0

    def add(self, trees: Tensor, ids: Tensor):
        """The batch-local id of every ``(trees[i], ids[i])``; pairs not
        seen before become new nodes, in order of first appearance.
        Returns ``(local ids, subtrees of the new nodes, their ids)``."""
        keys = trees * self.num_global + ids
        local = torch.full_like(keys, -1)
        if self.keys.numel() and keys.numel():
            at = torch.searchsorted(self.keys, keys).clamp_(
                max=self.keys.numel() - 1)
            found = self.keys[at] == keys
            local[found] = self.local[at[found]]
        else:
            found = torch.zeros_like(keys, dtype=torch.bool)
        new_keys, position = _first_appearance(keys[~found])
        local[~found] = self.count + position
        new_local = torch.arange(self.count, self.count + new_keys.numel())
        self.count += new_keys.numel()
        self.keys, order = torch.sort(torch.cat([self.keys, new_keys]))
        self.local = torch.cat([self.local, new_local])[order]
        return (local, new_keys // self.num_global,
                new_keys % self.num_global)


def disjoint_round(loader, seeds: Tensor, input_id: Tensor,
                   seed_time: Optional[Tensor] = None) -> Data:
    """One collective round of ``loader`` (a ``DistNeighborLoader``) with
    disjoint subtrees; the batch has ``batch`` (each node's subtree, i.e.
    its seed's position in the batch). With ``seed_time`` (temporal
    sampling) every subtree's edges are no later than its seed's time."""
    num_seeds = seeds.numel()
    nodes = Subtrees(loader.shard.num_nodes)
    _, first_tree, _ = nodes.add(torch.arange(num_seeds), seeds)
    trees, n_id = [first_tree], [seeds]
    frontier, frontier_tree = seeds, first_tree
    frontier_local = torch.arange(num_seeds)
    rows, cols, e_ids = [], [], []
    num_sampled_nodes, num_sampled_edges = [num_seeds], []
    for fanout in loader.num_neighbors:
        _, sources, edge_ids, per_entry = loader._exchange_hop(
            frontier, fanout,
            None if seed_time is None else seed_time[frontier_tree])
        entry = torch.repeat_interleave(torch.arange(frontier.numel()),
                                        per_entry)
        start = nodes.count
        local, new_tree, new_nodes = nodes.add(frontier_tree[entry], sources)
        trees.append(new_tree)
        n_id.append(new_nodes)
        rows.append(local)
        cols.append(frontier_local[entry])
        e_ids.append(edge_ids)
        num_sampled_nodes.append(new_nodes.numel())
        num_sampled_edges.append(edge_ids.numel())
        frontier, frontier_tree = new_nodes, new_tree
        frontier_local = torch.arange(start, nodes.count)
    edge_index = torch.stack([torch.cat(rows), torch.cat(cols)]) if rows \
        else torch.empty(2, 0, dtype=torch.long)
    e_id = torch.cat(e_ids) if e_ids else torch.empty(0, dtype=torch.long)
    extra = {'batch': torch.cat(trees)}
    if seed_time is not None:
        extra['seed_time'] = seed_time
    return loader._finish(torch.cat(n_id), edge_index, e_id, input_id,
                          num_seeds, num_sampled_nodes, num_sampled_edges,
                          **extra)
