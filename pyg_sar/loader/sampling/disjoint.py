"""Disjoint sampling (PyG's ``disjoint=True``): every seed grows its own
subtree, so a node reached from two seeds appears once in each subtree.

A node of a batch is a pair ``(subtree, global id)``, keyed
``subtree * num_nodes + id``. Each hop samples every frontier entry
independently (one collective hop,
:func:`~pyg_sar.loader.sampling.exchange.exchange_hop`), and the sources not
yet in their subtree become new nodes, in order of first appearance, as PyG
orders them. A homogeneous graph is the one-type case.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from pyg_sar.loader.sampling.neighborhood import EdgeType, Hop


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


def grow_subtrees(seeds: Tensor, input_type: str,
                  num_global: Dict[str, int], edge_types: Sequence[EdgeType],
                  num_hops: int, hop: Hop,
                  seed_time: Optional[Tensor] = None):
    """Grows one subtree per seed (nodes of ``input_type``) over
    ``num_hops`` hops (``hop``: one collective hop); ``num_global``: the
    number of global ids of every node type. With ``seed_time`` every edge
    of a subtree is no later than its seed's time. Returns ``(n_id,
    edge_index, e_id, batch, num_sampled_nodes, num_sampled_edges)`` per
    type, ``batch`` being each node's subtree (its seed's position)."""
    node_types = list(num_global)
    nodes = {t: Subtrees(n) for t, n in num_global.items()}
    empty = seeds.new_empty(0)
    num_seeds = seeds.numel()
    _, first_tree, _ = nodes[input_type].add(torch.arange(num_seeds), seeds)
    trees: Dict[str, List[Tensor]] = {t: [] for t in node_types}
    n_id: Dict[str, List[Tensor]] = {t: [] for t in node_types}
    trees[input_type].append(first_tree)
    n_id[input_type].append(seeds)
    # Per node type: (ids, subtrees, batch-local ids) of the last hop's nodes.
    frontier = {t: (empty, empty, empty) for t in node_types}
    frontier[input_type] = (seeds, first_tree, torch.arange(num_seeds))
    num_sampled_nodes = {t: [num_seeds if t == input_type else 0]
                         for t in node_types}
    num_sampled_edges: Dict[EdgeType, List[int]] = {e: [] for e in
                                                    edge_types}
    rows: Dict[EdgeType, List[Tensor]] = {e: [] for e in edge_types}
    cols: Dict[EdgeType, List[Tensor]] = {e: [] for e in edge_types}
    e_ids: Dict[EdgeType, List[Tensor]] = {e: [] for e in edge_types}
    for h in range(num_hops):
        times = None if seed_time is None else {
            t: seed_time[f[1]] for t, f in frontier.items()}
        sampled = hop({t: f[0] for t, f in frontier.items()}, h, times)
        starts = {t: n.count for t, n in nodes.items()}
        new: Dict[str, List[Tuple[Tensor, Tensor]]] = {
            t: [] for t in node_types}
        for e in edge_types:
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
        for t in node_types:
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
                  for e in edge_types}
    e_id = {e: torch.cat(e_ids[e]) if e_ids[e] else empty
            for e in edge_types}
    batch = {t: torch.cat(p) if p else empty for t, p in trees.items()}
    return cat, edge_index, e_id, batch, num_sampled_nodes, num_sampled_edges
