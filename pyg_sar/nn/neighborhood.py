"""Whole-neighborhood propagation: PyG's own ``propagate`` over complete
in-neighborhoods.

The SAR engine folds a layer block by block, which needs to know how the
layer aggregates. Anything else a :class:`~torch_geometric.nn.MessagePassing`
subclass may do (an overridden ``aggregate``, PyG's ``softmax(alpha, index,
ptr, size_i)`` inside ``message``, aggregation modules with state, an
``update`` with extra arguments, hooks, ``edge_updater``,
``decomposed_layers``, any ``node_dim``) is exact as soon as every destination
sees all of its in-edges at once. This module gives it that:

1. the halo rows of every tensor read as ``*_j`` are fetched in one exchange
   (:meth:`DistGraph.fetch_halo`, differentiable: gradients go back to the
   owners), and tensors read as ``*_i`` or by ``update`` are padded to the
   same rows, so the layer sees a graph of ``local + halo`` nodes in which
   every local node has all of its in-edges and halo nodes have none;
2. the destinations are cut into ranges whose in-edges fit the chunk limit
   (the graph's ``chunk_size``, else the engine's ``edge_memory_budget``);
   each range runs through ``MessagePassing.propagate`` itself, on a
   compacted subgraph (its destinations, then the sources it reads);
3. in ``"sar"`` mode every range is checkpointed (recomputed in backward,
   random state replayed), so only one range's per-edge tensors are alive.

Memory: the halo of every fetched tensor at once (the ``one_shot`` cost), plus
one chunk of per-edge tensors. A destination with more in-edges than the
chunk limit is its own chunk.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint
from torch_geometric.nn import MessagePassing

from pyg_sar import comm
from pyg_sar.graph import DistGraph

log = logging.getLogger('pyg_sar')
_LOGGED = set()


def log_once(module, reason: str) -> None:
    """One line per layer class and reason: which path runs, and its cost."""
    key = (type(module).__name__, reason)
    if key not in _LOGGED and comm.get_rank() == 0:
        _LOGGED.add(key)
        log.warning(
            "pyg_sar: %s runs whole neighborhoods (%s): exact, holds the "
            "halo rows of its inputs at once and one chunk of per-edge "
            "tensors", type(module).__name__, reason)


def _args(module, method: str) -> Tuple[List[str], List[str]]:
    """The argument names PyG collects for ``method`` and those of them read
    by ``update`` (node-level)."""
    if method == 'edge_updater':
        return list(module._edge_user_args), []
    update = module.inspector.get_param_names('update')
    return list(module._user_args), [a for a in update
                                     if a not in module.special_args]


def _roles(names: List[str], update_names: List[str]):
    j_names = {a[:-2] for a in names if a.endswith('_j')}
    i_names = {a[:-2] for a in names if a.endswith('_i')}
    return j_names, i_names | set(update_names)


class _Extender:
    """Maps local node tensors onto the ``local + halo`` rows: fetched where
    read as ``*_j``, zero-padded otherwise (each tensor once)."""

    def __init__(self, module, graph: DistGraph) -> None:
        self.module, self.graph = module, graph
        self.dim = module.node_dim
        self.cache: Dict[Tuple[int, bool], Tensor] = {}

    def __call__(self, name: str, t: Any, fetch: bool) -> Any:
        if not isinstance(t, Tensor):
            return t
        g = self.graph
        if t.dim() == 0 or t.size(self.dim) != g.num_nodes:
            if fetch:
                raise ValueError(
                    f"{type(self.module).__name__}: argument {name!r} is "
                    f"read as {name}_j but has {tuple(t.shape)} rows along "
                    f"node_dim={self.dim}; expected {g.num_nodes} (the "
                    f"local nodes of this worker)")
            return t
        key = (id(t), fetch)
        if key not in self.cache:
            if fetch:
                self.cache[key] = g.fetch_halo(t, self.dim)
            else:
                pad = list(t.shape)
                pad[self.dim] = g.num_halo_nodes
                self.cache[key] = torch.cat([t, t.new_zeros(pad)], self.dim)
        return self.cache[key]


def _extend_kwargs(module, graph: DistGraph, kwargs: Dict[str, Any],
                   names, update_names) -> Tuple[Dict[str, Any], set]:
    j_names, node_names = _roles(names, update_names)
    i, j = (1, 0) if module.flow == 'source_to_target' else (0, 1)
    extend = _Extender(module, graph)
    out, mapped = dict(kwargs), set()
    for name, value in kwargs.items():
        if name not in j_names and name not in node_names:
            continue
        fetch = name in j_names
        if isinstance(value, (tuple, list)) and len(value) == 2:
            pair = [None, None]
            pair[j] = extend(name, value[j], fetch)
            pair[i] = extend(name, value[i], False)
            out[name] = tuple(pair)
        else:
            out[name] = extend(name, value, fetch)
        if out[name] is not value:
            mapped.add(name)
    return out, mapped


class _NormCalled(Exception):
    pass


def norm_in_propagate(module, run_chunk) -> bool:
    """Whether a whole-graph norm of :mod:`pyg_sar.nn.norm` runs inside the
    layer's ``propagate`` (e.g. in EdgeConv's MLP, which normalizes per-edge
    messages over all edges): found once per module by running one chunk
    with the norms' entry trapped (no gradient, random state restored)."""
    known = module.__dict__.get('_sar_norm_in_propagate')
    if known is not None:
        return known
    norms = [m for m in module.modules()
             if type(m).__module__.startswith('pyg_sar.nn.norm')]
    found = False
    if norms:
        def trap(*_):
            raise _NormCalled

        handles = [m.register_forward_pre_hook(trap) for m in norms]
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                run_chunk()
        except _NormCalled:
            found = True
        finally:
            for h in handles:
                h.remove()
    module.__dict__['_sar_norm_in_propagate'] = found
    return found


def chunk_limit(module, graph: DistGraph, tensors: List[Tensor]) -> int:
    """Edges per chunk: the graph's ``chunk_size``, else what keeps one
    per-edge copy of every input row inside the engine's edge budget
    (:meth:`~pyg_sar.comm.CommConfig.edge_budget`: ``edge_memory_budget``,
    capped at one node-sized table of those rows, so it falls with the
    worker's share of the graph), and at least 8192 edges: each chunk is a
    full PyG ``propagate``, whose fixed cost should stay small."""
    if graph.chunk_size is not None:
        return graph.chunk_size
    row = sum(math.prod(t.shape) // max(t.shape[0], 1) * t.element_size()
              for t in tensors if t.dim() > 0) or 1
    device = tensors[0].device if tensors else 'cpu'
    return max(8192, comm.config().edge_budget(graph.num_nodes, row,
                                               device) // row)


def _destination_ranges(dst: Tensor, limit: int,
                        num_dst: int) -> Tuple[Tensor, List[Tuple[int, int,
                                                                   int, int]]]:
    """Edge order sorted by destination, and ranges ``(e0, e1, d0, d1)``:
    edges ``order[e0:e1]`` are all in-edges of destinations ``[d0, d1)``."""
    order = torch.argsort(dst, stable=True)
    ptr = dst.new_zeros(num_dst + 1)
    ptr[1:] = torch.bincount(dst, minlength=num_dst).cumsum(0)
    ranges, d0 = [], 0
    ptr_list = ptr.tolist()
    while d0 < num_dst:
        # Largest d1 with ptr[d1] - ptr[d0] <= limit, at least one node.
        d1 = int(torch.searchsorted(ptr, ptr_list[d0] + limit, right=True)) - 1
        d1 = min(max(d1, d0 + 1), num_dst)
        ranges.append((ptr_list[d0], ptr_list[d1], d0, d1))
        d0 = d1
    return order, ranges


def whole_propagate(module, graph: DistGraph, edge_index: Tensor,
                    kwargs: Dict[str, Any], method: str = 'propagate') -> Any:
    """Runs ``MessagePassing.propagate`` (or ``edge_updater``) of ``module``
    over complete neighborhoods (see the module docs).

    ``edge_index`` has the local aggregation ids in row ``i`` (1 for
    ``source_to_target``, 0 otherwise) and :meth:`DistGraph.fetch_halo` row
    ids in row ``j``; node tensors in ``kwargs`` hold the local rows.
    Returns the local rows (``propagate``) or the per-edge values in
    ``edge_index`` order (``edge_updater``).
    """
    if module.explain:
        raise ValueError(f"{type(module).__name__}: explain mode is not "
                         f"supported over a DistGraph")
    i = 1 if module.flow == 'source_to_target' else 0
    keep = edge_index[i] < graph.num_nodes
    if not bool(keep.all()):
        # Edges into halo nodes (self loops a layer added for every row it
        # saw) only feed rows that are dropped: leave them out.
        return _without_halo_edges(module, graph, edge_index, kwargs, method,
                                   keep)
    names, update_names = _args(module, method)
    kwargs.pop('size', None)
    ext, mapped = _extend_kwargs(module, graph, kwargs, names, update_names)
    num_edges = edge_index.size(1)
    node_tensors = [t for v in ext.values()
                    for t in (v if isinstance(v, (tuple, list)) else [v])
                    if isinstance(t, Tensor)]
    edge_names = {k for k, v in ext.items()
                  if isinstance(v, Tensor) and v.dim() > 0
                  and v.size(0) == num_edges and k not in mapped}
    base = (MessagePassing.propagate if method == 'propagate' else
            MessagePassing.edge_updater)
    device = next((t.device for t in node_tensors), edge_index.device)
    edge_index = edge_index.to(device)
    limit = chunk_limit(module, graph, node_tensors)
    dim = module.node_dim
    n_local = graph.num_nodes

    def run(ei: Tensor, kw: Dict[str, Any], rows: Optional[int]):
        out = base(module, ei, size=None, **kw)
        if method != 'propagate' or rows is None:
            return out
        return _narrow(out, dim, rows)

    def call(fn, *args):
        if graph.mode == 'sar' and torch.is_grad_enabled():
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)

    if num_edges <= limit:
        return call(run, edge_index, ext, n_local)

    order, ranges = _destination_ranges(edge_index[i].cpu(), limit, n_local)
    order = order.to(device)
    mapping = torch.full((graph.num_ext_nodes, ), -1, dtype=torch.long,
                         device=device)

    def chunk(e0: int, e1: int, d0: int, d1: int):
        sel = order[e0:e1]
        ei = edge_index.index_select(1, sel)
        src = ei[1 - i]
        other = torch.unique(src[(src < d0) | (src >= d1)])
        nodes = torch.cat([torch.arange(d0, d1, device=device), other])
        mapping[nodes] = torch.arange(nodes.numel(), device=device)
        ei = mapping[ei]

        def chunk_run():
            kw = {k: (_rows(v, dim, nodes) if k in mapped else
                      v.index_select(0, sel) if k in edge_names else v)
                  for k, v in ext.items()}
            return run(ei, kw, d1 - d0)

        return chunk_run

    if norm_in_propagate(module, chunk(*ranges[0])):
        # Statistics over every edge at once: one chunk, or each chunk
        # would normalize alone (and ranks with different chunk counts
        # would disagree on the number of collectives).
        log_once(module, 'a whole-graph norm inside propagate: no chunks')
        return call(run, edge_index, ext, n_local)
    outs = [call(chunk(*r)) for r in ranges]
    if method == 'propagate':
        return _cat(outs, dim)
    out = _cat(outs, 0)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=device)
    return out.index_select(0, inverse)


def _without_halo_edges(module, graph: DistGraph, edge_index: Tensor,
                        kwargs: Dict[str, Any], method: str,
                        keep: Tensor) -> Any:
    num_edges = edge_index.size(1)
    sel = keep.nonzero().view(-1)
    j_names, node_names = _roles(*_args(module, method))
    kwargs = {k: (v.index_select(0, sel) if isinstance(v, Tensor) and
                  v.dim() > 0 and v.size(0) == num_edges and
                  k not in j_names | node_names else v)
              for k, v in kwargs.items()}
    out = whole_propagate(module, graph, edge_index.index_select(1, sel),
                          kwargs, method)
    if method == 'propagate':
        return out
    full = out.new_zeros((num_edges, *out.shape[1:]))
    return full.index_copy(0, sel, out)


def _rows(value: Any, dim: int, nodes: Tensor) -> Any:
    """The rows ``nodes`` of a mapped node tensor (or of both of a pair)."""
    if isinstance(value, (tuple, list)):
        return tuple(_rows(v, dim, nodes) for v in value)
    if isinstance(value, Tensor) and value.dim() > 0:
        return value.index_select(dim, nodes)
    return value


def _narrow(out: Any, dim: int, rows: int) -> Any:
    if isinstance(out, (tuple, list)):
        return type(out)(_narrow(o, dim, rows) for o in out)
    return out.narrow(dim, 0, rows)


def _cat(outs: List[Any], dim: int) -> Any:
    if isinstance(outs[0], (tuple, list)):
        return type(outs[0])(_cat([o[k] for o in outs], dim)
                             for k in range(len(outs[0])))
    return torch.cat(outs, dim)


def propagate_on_graph(module, graph: DistGraph, kwargs: Dict[str, Any],
                       method: str = 'propagate') -> Any:
    """:func:`whole_propagate` over all in-edges of ``graph`` (or, for
    ``flow='target_to_source'``, all out-edges, through the reversed graph;
    per-edge tensors in the graph's edge order are moved along)."""
    if module.flow == 'source_to_target':
        return whole_propagate(module, graph, graph.halo_edge_index(), kwargs,
                               method)
    if method != 'propagate':
        raise ValueError(f"{type(module).__name__}: edge_updater with "
                         f"flow='target_to_source' is not supported over a "
                         f"DistGraph")
    rev = graph.reverse()
    kwargs = pull_edge_tensors(module, graph, rev, kwargs)
    return whole_propagate(module, rev, rev.halo_edge_index().flip(0), kwargs,
                           method)


def pull_edge_tensors(module, graph: DistGraph, rev, values: Dict[str, Any]
                      ) -> Dict[str, Any]:
    """Per-edge tensors (first dimension = the graph's edges) in the edge
    order of the reversed graph ``rev``; ambiguous sizes are refused."""
    out = dict(values)
    for name, value in values.items():
        if not isinstance(value, Tensor) or value.dim() == 0 or \
                value.size(0) != graph.num_edges:
            continue
        if graph.num_edges == graph.num_nodes:
            raise ValueError(
                f"{type(module).__name__}: cannot tell whether {name!r} is "
                f"per node or per edge (this worker has {graph.num_nodes} "
                f"nodes and as many edges) with flow='target_to_source'")
        out[name] = rev.pull_edge_values(value)
    return out
