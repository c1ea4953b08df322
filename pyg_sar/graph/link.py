"""Full-batch link prediction over a :class:`~pyg_sar.DistGraph`.

A link predictor scores node pairs whose endpoints live on different workers.
Three collective pieces make that exact and keep memory at 1/N:

- :func:`global_ids`: the partition's global ids of nodes given by their ids
  in the input graph (what ``RandomLinkSplit`` and ``negative_sampling``
  produce), through a directory spread over the workers (no worker holds
  the whole permutation).
- :func:`fetch_nodes`: the rows of any global node ids, from their owners,
  differentiable: the gradient of every copy of a row goes back to its owner
  and is summed there.
- :func:`negative_sampling`: PyG's ``negative_sampling`` on the whole graph,
  without gathering it. It draws the same candidates from Python's
  ``random`` as PyG does, so with the same random state it returns the same
  negatives, at every world size; each candidate is checked against the
  edges by the owner of its destination.

All communication goes through :mod:`pyg_sar.comm`.
"""
from __future__ import annotations

from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.graph.exchange import RowPlan, fetch_rows


def _by_owner(keys: Tensor, owner: Tensor,
              world_size: int) -> Tuple[List[Tensor], List[Tensor]]:
    """``keys`` grouped by owner rank, and the positions each group came
    from."""
    order = torch.argsort(owner, stable=True)
    counts = torch.bincount(owner, minlength=world_size).tolist()
    positions = list(order.split(counts))
    return [keys[pos] for pos in positions], positions


def _check_range(ids: Tensor, bound: int, what: str) -> None:
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{what} must be an integer tensor (got {ids.dtype})")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= bound):
        bad = ids[(ids < 0) | (ids >= bound)][0]
        raise ValueError(f"{what} contains node id {int(bad)}, outside "
                         f"[0, {bound})")


# Rows of any node ###########################################################


def node_plan(graph, ids: Tensor) -> RowPlan:
    """The :class:`~pyg_sar.graph.exchange.RowPlan` that reads the rows of
    global node ids ``ids`` (any order, repeats allowed) from their owners.
    Collective."""
    ids = ids.to(graph.device).long().view(-1)
    _check_range(ids, graph.num_global_nodes, 'ids')
    P, p = graph.world_size, graph.rank
    owner = torch.searchsorted(graph.node_ptr, ids, right=True) - 1
    groups, positions = _by_owner(ids, owner, P)
    requests = [g - graph.node_ptr[q] for q, g in enumerate(groups)]
    asked = comm.all_to_all_v(requests)
    return RowPlan(
        int(ids.numel()), requests[p], positions[p],
        {q: asked[q] for q in range(P) if q != p and asked[q].numel()},
        {q: positions[q] for q in range(P)
         if q != p and positions[q].numel()})


def fetch_nodes(graph, x: Tensor, ids: Tensor) -> Tensor:
    """``x[ids]`` for global node ids ``ids`` of the whole graph, where every
    worker passes the rows ``x`` of its own nodes: one row per id, fetched
    from its owner. Differentiable (the gradients of a row's copies are
    summed at its owner); collective."""
    if x.shape[0] != graph.num_nodes:
        raise ValueError(f"x has {x.shape[0]} rows but this worker owns "
                         f"{graph.num_nodes} nodes")
    return fetch_rows(node_plan(graph, ids), x)


# Input ids -> global ids ####################################################


def _directory(graph) -> Tuple[Tensor, Tensor]:
    """This worker's share of the input-id directory: sorted input ids
    ``i`` with ``i % world_size == rank`` and their global ids (built once,
    collective)."""
    if 'id_directory' not in graph.derived:
        P = graph.world_size
        mine = torch.arange(graph.node_offset,
                            graph.node_offset + graph.num_nodes,
                            device=graph.device)
        pairs = torch.stack([graph.orig_ids.to(graph.device), mine], 1)
        groups, _ = _by_owner(pairs, pairs[:, 0] % P, P)
        table = torch.cat(comm.all_to_all_v(groups))
        order = torch.argsort(table[:, 0])
        graph.derived['id_directory'] = (table[order, 0].contiguous(),
                                         table[order, 1].contiguous())
    return graph.derived['id_directory']


def global_ids(graph, input_ids: Tensor) -> Tensor:
    """The partition's global ids of nodes given by their ids in the input
    graph (the graph ``partition_graph`` was given). Collective; each worker
    may ask for different ids. An unknown id fails on every worker."""
    input_ids = input_ids.to(graph.device).long()
    shape = input_ids.shape
    input_ids = input_ids.reshape(-1)
    keys, values = _directory(graph)

    def look_up(asked: Tensor) -> Tensor:
        if keys.numel() == 0 or asked.numel() == 0:
            return torch.full_like(asked, -1)
        at = torch.searchsorted(keys, asked).clamp_(max=keys.numel() - 1)
        return torch.where(keys[at] == asked, values[at], -1)

    out = comm.ask_owners(input_ids, input_ids % graph.world_size, look_up)
    missing = int((out < 0).sum())
    anywhere = comm.all_reduce(torch.tensor([missing]), 'max')
    if int(anywhere[0]) > 0:
        first = f"; here: input id {int(input_ids[out < 0][0])}" \
            if missing else ''
        raise ValueError(f"global_ids: {int(anywhere[0])} input node ids "
                         f"(max over ranks) are not nodes of the partitioned "
                         f"graph ({graph.num_global_nodes} nodes){first}")
    return out.view(shape)


# Negative sampling ##########################################################


def _edge_keys(graph) -> Tensor:
    """Sorted ``local destination * N + global source`` of this worker's
    in-edges (built once)."""
    if 'edge_keys' not in graph.derived:
        keys = graph.edge_dst() * graph.num_global_nodes + graph._src_global
        graph.derived['edge_keys'] = torch.sort(keys).values
    return graph.derived['edge_keys']


def edges_exist(graph, src: Tensor, dst: Tensor) -> Tensor:
    """Whether each pair ``src[i] -> dst[i]`` (global ids) is an edge of the
    graph, answered by the owner of ``dst[i]``. Collective; every worker
    asks its own pairs."""
    N = graph.num_global_nodes
    owner = torch.searchsorted(graph.node_ptr, dst, right=True) - 1
    table = _edge_keys(graph)

    def look_up(asked: Tensor) -> Tensor:
        if table.numel() == 0 or asked.numel() == 0:
            return torch.zeros_like(asked, dtype=torch.uint8)
        at = torch.searchsorted(table, asked).clamp_(max=table.numel() - 1)
        return (table[at] == asked).to(torch.uint8)

    keys = (dst - graph.node_ptr[owner]) * N + src
    return comm.ask_owners(keys, owner, look_up).bool()


def _input_edges(graph) -> Tuple[Tensor, Tensor]:
    """Input ids ``(src, dst)`` of this worker's in-edges (built once)."""
    if 'input_edges' not in graph.derived:
        orig = graph.orig_ids.to(graph.device).view(-1, 1)
        ext = graph.fetch_halo(orig).view(-1)
        src, dst = graph.halo_edge_index()
        graph.derived['input_edges'] = (ext[src], ext[dst])
    return graph.derived['input_edges']


def negative_sampling(graph, num_nodes: Optional[int] = None,
                      num_neg_samples: Optional[Union[int, float]] = None,
                      method: str = 'sparse',
                      force_undirected: bool = False) -> Tensor:
    """PyG's :func:`torch_geometric.utils.negative_sampling` for the whole
    distributed graph, in input node ids: the ``[2, K]`` negatives that
    ``negative_sampling(edge_index, num_nodes, num_neg_samples, method,
    force_undirected)`` returns on one machine for the input graph's
    ``edge_index``, given the same state of Python's ``random`` on every
    worker. Every worker gets all K negatives (score a share of them each).

    Same signature as PyG's, with the :class:`~pyg_sar.DistGraph` in place
    of ``edge_index``; ``num_nodes``, if given, must be the graph's number
    of nodes (``graph.num_global_nodes``).

    Candidates are drawn as PyG draws them; each worker checks a share of
    them against the edges of their destinations' owners. Memory: the
    candidates (about 1.1 K ids), not the graph. Collective.
    """
    from torch_geometric.utils._negative_sampling import (
        sample, vector_to_edge_index)
    if method not in ('sparse', 'dense'):
        raise ValueError(f"method must be 'sparse' or 'dense' (got "
                         f"{method!r}); both give the same negatives")
    if not isinstance(num_neg_samples, (int, float, type(None))) or \
            isinstance(num_neg_samples, bool):
        raise TypeError(f"num_neg_samples must be an int, a float ratio or "
                        f"None (got {type(num_neg_samples).__name__}; "
                        f"bipartite sizes are not supported)")
    N = graph.num_global_nodes
    if num_nodes is not None and (isinstance(num_nodes, bool) or
                                  not isinstance(num_nodes, int) or
                                  num_nodes != N):
        raise ValueError(f"negative_sampling: num_nodes={num_nodes!r} is not "
                         f"the graph's number of nodes ({N}); pass "
                         f"num_neg_samples by keyword")
    size = (N, N)
    src, dst = _input_edges(graph)
    if force_undirected:
        positives = int((src < dst).sum())
        population = (N * (N + 1)) // 2 - N
    else:
        positives = int((src != dst).sum())
        population = N * N - N
    counts = comm.all_reduce(torch.tensor([positives, graph.num_edges]),
                             'sum')
    positives, num_edges = int(counts[0]), int(counts[1])
    empty = torch.empty((2, 0), dtype=torch.long, device=graph.device)
    if positives >= population:
        return empty
    if num_neg_samples is None:
        num_neg_samples = num_edges
    elif isinstance(num_neg_samples, float):
        num_neg_samples = int(num_neg_samples * num_edges)
    if force_undirected:
        num_neg_samples = num_neg_samples // 2
    prob = 1. - positives / population
    sample_size = int(1.1 * num_neg_samples / prob)
    P, p = graph.world_size, graph.rank
    neg_idx: Optional[Tensor] = None
    for _ in range(3):
        rnd = sample(population, sample_size, device='cpu')
        # This worker checks its share of the candidates.
        lo, hi = p * rnd.numel() // P, (p + 1) * rnd.numel() // P
        pairs = vector_to_edge_index(rnd[lo:hi], size, False,
                                     force_undirected)[:, :hi - lo]
        pairs = global_ids(graph, pairs.to(graph.device))
        hit = torch.zeros(rnd.numel(), dtype=torch.uint8)
        hit[lo:hi] = edges_exist(graph, pairs[0], pairs[1]).to(
            torch.uint8).cpu()
        mask = comm.all_reduce(hit, 'max').bool()
        if neg_idx is not None:
            mask |= torch.isin(rnd, neg_idx)
        rnd = rnd[~mask]
        neg_idx = rnd if neg_idx is None else torch.cat([neg_idx, rnd])
        if neg_idx.numel() >= num_neg_samples:
            neg_idx = neg_idx[:num_neg_samples]
            break
    if neg_idx is None or neg_idx.numel() == 0:
        return empty
    return vector_to_edge_index(neg_idx, size, False,
                                force_undirected).to(graph.device)


def local_share(num: int) -> slice:
    """This worker's contiguous share of ``num`` items (e.g. the columns of
    an ``edge_label_index`` every worker holds): ``rank/N`` to
    ``(rank+1)/N``."""
    rank, world_size = comm.get_rank(), comm.get_world_size()
    return slice(rank * num // world_size, (rank + 1) * num // world_size)
