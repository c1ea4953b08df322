"""Layer-wise message-flow graphs: compute only what the seeds need.

A model that reads its output at a few seed nodes (the training nodes of a
node-classification loss) needs its last propagation only at the seeds, the
one before only at the seeds and their in-neighbors, and so on. With

    mfg = graph.layer_wise(part.train_mask, hops=3)   # collective, once
    with mfg:
        out = model(x, graph)                          # the model unchanged
    loss = F.cross_entropy(out[part.train_mask], ...)

propagation ``k`` (counted in call order) aggregates only the in-edges of its
destination set ``D_k``: ``D_last`` are the seeds and ``D_{k-1} = D_k`` plus
the in-neighbors of ``D_k``, found across workers (an owner learns which of
its rows a peer's ``D_k`` reads). Every row the seeds depend on is computed
exactly as in the full computation, so the outputs at the seeds and every
gradient are equal to it; the other rows of the output are not (use only
``out[seeds]``).

What keeps this exact is also what it refuses, with an error naming it:
layers off the SAR engine (the whole-neighborhood path, which mixes rows in
ways the sets do not track), more propagations than ``hops``, attention
dropout (its mask depends on the edges visited) and norms that mix all
nodes (their statistics would see rows that are not computed). Linear
layers, activations and dropout run on all rows and draw the same random
numbers as the full computation. Savings: the aggregation work and per-edge
memory of the propagations; the exchange still moves every halo row.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.graph.blocks import EdgeBlock

# The LayerWise object whose ``with`` block is running, if any (norm layers
# check it: their statistics mix all rows).
_ACTIVE: List['LayerWise'] = []


def active() -> Optional['LayerWise']:
    """The layer-wise computation in progress, or ``None``."""
    return _ACTIVE[-1] if _ACTIVE else None


class LayerWise:
    """The per-propagation destination sets of one set of seeds (built by
    :meth:`pyg_sar.DistGraph.layer_wise`); use it as a context manager
    around the model's forward."""

    def __init__(self, graph, seeds: Tensor, hops: int) -> None:
        if isinstance(hops, bool) or not isinstance(hops, int) or hops < 1:
            raise ValueError(f"hops must be a positive int (the number of "
                             f"propagations of the model), got {hops!r}")
        self.graph = graph
        self.hops = hops
        self.masks = _destination_sets(graph, _seed_mask(graph, seeds), hops)
        self.cursor = 0
        self._views: Dict[Tuple[int, int], object] = {}

    def __enter__(self) -> 'LayerWise':
        if self.graph._layer_wise[0] is not None:
            raise RuntimeError("a layer-wise computation is already running "
                               "on this graph")
        self.cursor = 0
        self.graph._layer_wise[0] = self
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        self.graph._layer_wise[0] = None
        _ACTIVE.remove(self)

    def num_destinations(self) -> List[int]:
        """Local destinations computed by each propagation."""
        return [int(m.sum()) for m in self.masks]

    def step(self, module, graph):
        """The restricted view of ``graph`` for the next propagation of
        ``module``."""
        if self.cursor >= self.hops:
            raise ValueError(
                f"{type(module).__name__}: the model runs more than "
                f"hops={self.hops} propagations; build layer_wise with the "
                f"number of propagate calls of one forward")
        mask = self.masks[self.cursor]
        key = (id(graph), self.cursor)
        self.cursor += 1
        if key not in self._views:
            self._views[key] = _restricted(graph, mask)
        return self._views[key]


def _seed_mask(graph, seeds: Tensor) -> Tensor:
    seeds = torch.as_tensor(seeds, device=graph.device)
    if seeds.dtype == torch.bool:
        if seeds.numel() != graph.num_nodes:
            raise ValueError(f"seed mask has {seeds.numel()} entries; this "
                             f"worker owns {graph.num_nodes} nodes")
        return seeds.clone()
    mask = torch.zeros(graph.num_nodes, dtype=torch.bool,
                       device=graph.device)
    local = seeds.long() - graph.node_offset
    if local.numel() and (int(local.min()) < 0 or
                          int(local.max()) >= graph.num_nodes):
        raise ValueError("seeds must be a mask over the local nodes or "
                         "global ids this worker owns")
    mask[local] = True
    return mask


def _destination_sets(graph, seeds: Tensor, hops: int) -> List[Tensor]:
    """``D_0 ... D_{hops-1}`` (collective): the last are the seeds, each
    earlier one adds the in-neighbors of the next."""
    masks = [seeds]
    for _ in range(hops - 1):
        current = masks[0]
        needed = current.clone()
        requests = [torch.empty(0, dtype=torch.long, device=graph.device)
                    for _ in range(graph.world_size)]
        for block in graph.blocks:
            chosen = block.src[current[block.dst]]
            if block.peer == graph.rank:
                needed[chosen] = True
            else:
                requests[block.peer] = graph.recv_ids[block.peer][
                    torch.unique(chosen)]
        for rows in comm.all_to_all_v(requests):
            needed[rows] = True
        masks.insert(0, needed)
    return masks


# A hop that keeps at least this share of the edges runs on the graph itself:
# computing a few rows more is exact too, and saves a near-copy of the edge
# lists.
FULL_GRAPH_SHARE = 0.9


def _restricted(graph, mask: Tensor):
    """A view of ``graph`` whose blocks hold only the in-edges of the
    destinations in ``mask`` (same edge numbering, same exchange plan), or
    the graph itself when that would keep most edges."""
    kept = sum(int(mask[block.dst].sum()) for block in graph.blocks)
    if kept >= FULL_GRAPH_SHARE * sum(b.num_edges for b in graph.blocks):
        return graph
    view = object.__new__(type(graph))
    view.__dict__.update(graph.__dict__)
    view.blocks = []
    for block in graph.blocks:
        keep = mask[block.dst]
        view.blocks.append(EdgeBlock(block.peer, block.num_src,
                                     block.src[keep], block.dst[keep],
                                     block.edge_pos[keep], block.num_nodes,
                                     block.chunk_size))
    view._merged = None
    # Caches of the view are its own: nothing built from its fewer edges
    # may reach the full graph.
    view._views, view._source_cache = {}, {}
    view.derived = dict(graph.derived)
    return view
