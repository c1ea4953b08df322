"""HGSampling (Hu et al., "Heterogeneous Graph Transformer", 2020), the
sampler of PyG's ``HGTLoader`` (``torch_sparse.hgt_sample``), on
collectives (:func:`hgt_sample`).

The batch starts with its seeds. Every node type keeps a *budget*: the
nodes not sampled yet that are in-neighbors (sources of an in-edge, of any
edge type) of a sampled node, each with a weight. A newly sampled node
``w`` of type ``dst`` adds, for every edge type ``(src, rel, dst)``, to each
source ``v`` of its in-edges of that type that is not sampled yet
``1 / deg(w)``, ``deg(w)`` being ``w``'s in-degree over that edge type (a
duplicate edge adds twice). As in ``torch_sparse``, a node with more than
:data:`MAX_NEIGHBORS` in-edges of a type adds ``1 / MAX_NEIGHBORS`` to the
sources of that many of them, drawn uniformly without replacement. Each
iteration ``i`` draws, per node type ``t``, ``num_samples[t][i]`` nodes of
its budget without replacement, in proportion to their weight squared (all
of them when the budget is no larger), adds them to the batch (in draw
order) and out of the budget; then their in-neighbors enter the budgets.

A node's in-edges live on its owner, so each budget update is one
collective hop (:func:`~pyg_sar.loader.sampling.exchange.exchange_hop`) of
every edge type at once (:func:`in_neighbors`); the budgets themselves are
kept by the rank building the batch, sparse (O(batch), not O(graph)).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import torch
from torch import Tensor

from pyg_sar.loader.sampling.exchange import Sampled, answer, exchange_hop
from pyg_sar.loader.sampling.neighborhood import BatchIds, EdgeType

# torch_sparse's cap on the in-edges of a node that feed the budget.
MAX_NEIGHBORS = 50


def in_neighbors(shard, new: Dict[str, Tensor], rank: int, world_size: int,
                 generator: torch.Generator) -> Dict[EdgeType, Sampled]:
    """Per edge type ``(src, rel, dst)`` of ``shard`` (a
    :class:`~pyg_sar.loader.shards.hetero_shard.HeteroShard`), the in-edges
    of the nodes ``new[dst]`` (all of them, or :data:`MAX_NEIGHBORS` drawn
    without replacement), from their owners: ``(target, source, edge id,
    count per entry of new[dst])`` (collective, one hop of every edge
    type)."""
    edge_types = shard.edge_types

    def serve(i: int, asked: Tensor, _) -> Tuple[Tensor, Tensor, Tensor]:
        e = edge_types[i]
        return answer(shard.edges[e], asked - shard.nodes[e[2]].node_start,
                      MAX_NEIGHBORS, False, generator)
    return dict(zip(edge_types, exchange_hop(
        [new[e[2]] for e in edge_types],
        [shard.nodes[e[2]].owner(new[e[2]]) for e in edge_types],
        serve, rank, world_size)))


class Budget:
    """The budget of one node type: distinct global ids (ascending) and
    their weights (float64)."""

    def __init__(self) -> None:
        self.ids = torch.empty(0, dtype=torch.long)
        self.weight = torch.empty(0, dtype=torch.float64)

    def add(self, ids: Tensor, weight: Tensor) -> None:
        """Adds ``weight[i]`` to the budget of ``ids[i]`` (repeats sum)."""
        if ids.numel() == 0:
            return
        self.ids, inverse = torch.unique(torch.cat([self.ids, ids]),
                                         return_inverse=True)
        self.weight = torch.zeros(self.ids.numel(), dtype=torch.float64) \
            .index_add_(0, inverse, torch.cat([self.weight, weight]))

    def draw(self, num: int, generator: torch.Generator) -> Tensor:
        """``num`` ids drawn without replacement in proportion to their
        weight squared, in draw order (every id, ascending, when there are
        no more than ``num``), and removed from the budget. The draw is
        successive sampling (as ``torch.multinomial`` without replacement)
        by exponential keys: the ``num`` smallest ``E / weight**2``,
        ``E ~ Exp(1)``, in increasing order."""
        if num >= self.ids.numel():
            out, self.ids = self.ids, self.ids[:0]
            self.weight = self.weight[:0]
            return out
        if num == 0:
            return self.ids[:0]
        keys = torch.empty(self.ids.numel(), dtype=torch.float64).exponential_(
            generator=generator) / self.weight.square()
        chosen = torch.topk(keys, num, largest=False, sorted=True).indices
        keep = torch.ones(self.ids.numel(), dtype=torch.bool)
        keep[chosen] = False
        out = self.ids[chosen]
        self.ids, self.weight = self.ids[keep], self.weight[keep]
        return out


def grow_budgets(budgets: Dict[str, Budget], ids: Dict[str, BatchIds],
                 edges: Dict[EdgeType, Sampled]) -> None:
    """Adds the in-neighbors ``edges`` of newly sampled nodes (as
    :func:`in_neighbors` gives them) that are not in the batch (``ids``) to
    the budgets: ``1 / count`` each, ``count`` being the number of in-edges
    of the edge type drawn for the node they enter."""
    for (src, _, _), (_, sources, _, counts) in edges.items():
        weight = torch.repeat_interleave(
            1.0 / counts.clamp(min=1).to(torch.float64), counts)
        fresh = ids[src].index[sources] < 0
        budgets[src].add(sources[fresh], weight[fresh])


def hgt_sample(seeds: Dict[str, Tensor], ids: Dict[str, BatchIds],
               num_samples: Dict[str, List[int]],
               neighbors: Callable[[Dict[str, Tensor]],
                                   Dict[EdgeType, Sampled]],
               generator: torch.Generator
               ) -> Tuple[Dict[str, Tensor], Dict[str, List[int]]]:
    """HGSampling from the distinct ``seeds`` (global ids per node type)
    over ``len(num_samples[t])`` iterations (the same for every type), with
    the batch-local ids of ``ids`` (one per node type, clean; clean again on
    return). ``neighbors(new)`` gives the in-edges of the nodes ``new`` per
    edge type (collective: :func:`in_neighbors`; called once per iteration
    on every rank). Returns per node type the sampled global ids (seeds,
    then every iteration's draws in draw order) and their number per
    iteration, seeds first."""
    empty = torch.empty(0, dtype=torch.long)
    node_types = list(ids)
    num_iterations = len(next(iter(num_samples.values()), []))
    budgets = {t: Budget() for t in node_types}
    new = {t: seeds.get(t, empty) for t in node_types}
    for t in node_types:
        ids[t].put(new[t])
    counts = {t: [new[t].numel()] for t in node_types}
    try:
        for i in range(num_iterations):
            grow_budgets(budgets, ids, neighbors(new))
            for t in node_types:
                new[t] = budgets[t].draw(num_samples[t][i], generator)
                ids[t].put(new[t])
                counts[t].append(new[t].numel())
    finally:
        n_id = {t: ids[t].release() for t in node_types}
    return n_id, counts
