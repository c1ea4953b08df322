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

Relational layers (``RGCNConv``, ``FastRGCNConv``) propagate over a
relation view whose destination rows are ``(node, relation)`` pairs; their
propagation keeps every relation row of the nodes in ``D_k``.

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
        _check_hops(hops)
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


def _check_hops(hops) -> None:
    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 1:
        raise ValueError(f"hops must be a positive int (the number of "
                         f"propagations of the model), got {hops!r}")


def _seed_mask(graph, seeds: Tensor) -> Tensor:
    return _mask_of(seeds, graph.num_nodes, graph.node_offset, graph.device)


def _mask_of(seeds: Tensor, num_nodes: int, offset: int, device) -> Tensor:
    """A mask over ``num_nodes`` local nodes from a mask or global ids
    (the first local one being ``offset``)."""
    seeds = torch.as_tensor(seeds, device=device)
    if seeds.dtype == torch.bool:
        if seeds.numel() != num_nodes:
            raise ValueError(f"seed mask has {seeds.numel()} entries; this "
                             f"worker owns {num_nodes} nodes")
        return seeds.clone()
    mask = torch.zeros(num_nodes, dtype=torch.bool, device=device)
    local = seeds.long() - offset
    if local.numel() and (int(local.min()) < 0 or
                          int(local.max()) >= num_nodes):
        raise ValueError("seeds must be a mask over the local nodes or "
                         "global ids this worker owns")
    mask[local] = True
    return mask


def _destination_sets(graph, seeds: Tensor, hops: int) -> List[Tensor]:
    """``D_0 ... D_{hops-1}`` (collective): the last are the seeds, each
    earlier one adds the in-neighbors of the next."""
    masks = [seeds]
    for _ in range(hops - 1):
        needed = masks[0].clone()
        _add_in_neighbors(graph, masks[0], needed)
        masks.insert(0, needed)
    return masks


def _add_in_neighbors(graph, current: Tensor, needed: Tensor) -> None:
    """Marks in ``needed`` (over the local source rows) the sources of
    every in-edge of the destinations in ``current``, on their owners
    (collective: one ``all_to_all``)."""
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


class HeteroLayerWise:
    """Layer-wise MFGs of a model over a
    :class:`~pyg_sar.graph.HeteroDistGraph` (``to_hetero`` models,
    ``HeteroConv``): per node type destination sets; propagation ``k`` of
    every relation ``(src, rel, dst)`` (counted per relation, in call
    order) aggregates only into ``D_k[dst]``, and ``D_{k-1}[src]`` adds the
    sources of those edges. Built by :func:`hetero_layer_wise`; use it as
    a context manager around the model's forward, and read the outputs at
    the seeds only."""

    def __init__(self, graph, seeds: Dict[str, Tensor], hops: int) -> None:
        _check_hops(hops)
        self.graph = graph
        self.hops = hops
        masks = {}
        for t in graph.node_types:
            n = graph.num_nodes_dict[t]
            masks[t] = torch.zeros(n, dtype=torch.bool, device=graph.device)
        for t, ids in seeds.items():
            if t not in masks:
                raise ValueError(f"seeds name node type {t!r}, which the "
                                 f"graph lacks (node types: "
                                 f"{graph.node_types})")
            masks[t] = _mask_of(ids, graph.num_nodes_dict[t],
                                graph.node_offset(t), graph.device)
        self.masks = _hetero_destination_sets(graph, masks, hops)
        self._relations = {e: _RelationSteps(self, e)
                           for e in graph.edge_types}

    def __enter__(self) -> 'HeteroLayerWise':
        for e, steps in self._relations.items():
            if self.graph[e]._layer_wise[0] is not None:
                raise RuntimeError("a layer-wise computation is already "
                                   "running on this graph")
        for e, steps in self._relations.items():
            steps.cursor = 0
            self.graph[e]._layer_wise[0] = steps
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        for e in self._relations:
            self.graph[e]._layer_wise[0] = None
        _ACTIVE.remove(self)

    def num_destinations(self) -> List[Dict[str, int]]:
        """Local destinations of every node type, per propagation."""
        return [{t: int(m.sum()) for t, m in masks.items()}
                for masks in self.masks]


class _RelationSteps:
    """The layer-wise state of one relation graph of a
    :class:`HeteroLayerWise` (what ``graph._layer_wise`` holds)."""

    def __init__(self, parent: HeteroLayerWise, edge_type) -> None:
        self.parent, self.edge_type = parent, edge_type
        self.cursor = 0
        self._views: Dict[Tuple[int, int], object] = {}

    def step(self, module, graph):
        parent = self.parent
        if self.cursor >= parent.hops:
            raise ValueError(
                f"{type(module).__name__}: the model runs more than "
                f"hops={parent.hops} propagations over {self.edge_type}; "
                f"build layer_wise with the number of propagate calls of "
                f"one forward per relation")
        mask = parent.masks[self.cursor][self.edge_type[2]]
        key = (id(graph), self.cursor)
        self.cursor += 1
        if key not in self._views:
            self._views[key] = _restricted(graph, mask)
        return self._views[key]


def hetero_layer_wise(graph, seeds: Dict[str, Tensor],
                      hops: int) -> HeteroLayerWise:
    """The layer-wise MFGs of a heterogeneous graph (collective, once):
    ``seeds`` maps node types to a boolean mask over their local nodes or
    global ids this worker owns, ``hops`` is the number of propagations of
    every relation in one forward. Exact at the seeds, as
    :meth:`pyg_sar.DistGraph.layer_wise`."""
    if not isinstance(seeds, dict):
        raise TypeError(f"seeds of a heterogeneous graph must be a dict "
                        f"from node type to mask or ids (got "
                        f"{type(seeds).__name__})")
    return HeteroLayerWise(graph, seeds, hops)


def _hetero_destination_sets(graph, seeds: Dict[str, Tensor], hops: int
                             ) -> List[Dict[str, Tensor]]:
    """``D_0 ... D_{hops-1}`` per node type (collective, one exchange per
    relation and hop, relations in the graph's order)."""
    masks = [seeds]
    for _ in range(hops - 1):
        current = masks[0]
        needed = {t: m.clone() for t, m in current.items()}
        for e in graph.edge_types:
            src, _, dst = e
            _add_in_neighbors(graph[e], current[dst], needed[src])
        masks.insert(0, needed)
    return masks


# A hop that keeps at least this share of the edges runs on the graph itself:
# computing a few rows more is exact too, and saves a near-copy of the edge
# lists.
FULL_GRAPH_SHARE = 0.9


def _restricted(graph, mask: Tensor):
    """A view of ``graph`` whose blocks hold only the in-edges of the
    destinations in ``mask`` (same edge numbering, same exchange plan), or
    the graph itself when that would keep most edges. On a relation view
    (``RGCNConv``: destination row ``v * R + r`` for node ``v`` and
    relation ``r``) every relation row of a node in ``mask`` is kept."""
    expansion = getattr(graph, 'relation_expansion', None)
    if expansion is not None and \
            mask.numel() * expansion == graph.num_nodes:
        mask = mask.repeat_interleave(expansion)
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
