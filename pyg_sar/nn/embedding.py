r"""A node-embedding table sharded by the partition: :class:`DistEmbedding`.

A stock ``torch.nn.Embedding(num_nodes, d)`` used as a table of one trainable
row per node (row ``i`` is node ``i`` of the input graph: ``LightGCN``,
``Node2Vec``-style models, user models) holds the whole graph on every
worker. :class:`DistEmbedding` keeps only the rows of this worker's nodes,
in the order of its local nodes (local node ``j`` is input node
``graph.orig_ids[j]``), so that ``.weight`` is a node-feature matrix of the
local nodes that the converted layers propagate like any other; memory per
worker is about ``num_nodes / N`` rows.

- ``table()`` (or ``.weight``): the local rows, e.g. the input of a
  propagation over the :class:`~pyg_sar.DistGraph`;
- ``table(ids)``: the rows of any input-graph node ids, each fetched from
  its owner (:func:`pyg_sar.graph.link.fetch_nodes`'s exchange), as
  ``Embedding(ids)`` on one process. Gradients of every copy of a row are
  summed at its owner; with ``sparse=True`` the owner's gradient is a
  sparse tensor, as the stock module's (``SparseAdam``, ``SGD``). Collective.

Parameters of a full-batch model are replicated; a sharded table is not:
:func:`pyg_sar.sync_params` and :func:`pyg_sar.all_reduce_grads` leave it
alone (its ``sar_sharded`` flag), and the replicated checkpoints of
:mod:`pyg_sar.train.checkpoint` refuse it (its shards differ by rank).

**State.** ``state_dict()`` holds this worker's rows (collective-free);
:meth:`DistEmbedding.full_state_dict` gives the stock model's whole
``state_dict`` (collective). ``load_state_dict`` takes a stock table (all
``num_embeddings`` rows, in input-graph order) and keeps the local rows; a
shard (fewer rows) is refused, since nothing in it says which worker's rows
it holds. A worker that holds every node writes its table in input-graph
order too, so at one worker ``state_dict()`` is the stock one.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from pyg_sar import comm
from pyg_sar.graph import DistGraph
from pyg_sar.graph.exchange import RowPlan, fetch_rows
from pyg_sar.graph.link import global_ids, node_plan


def _input_ids(graph: DistGraph) -> Tensor:
    """The input-graph id of every local node."""
    ids = graph.orig_ids
    if ids is None:
        ids = torch.arange(graph.node_offset,
                           graph.node_offset + graph.num_nodes)
    return ids.long()


# Rows drawn per block by draw_rows (a multiple of 16).
DRAW_BLOCK_ROWS = 1 << 14


def _normal(block: Tensor, num_rows: int) -> None:
    torch.nn.init.normal_(block)


def _xavier_uniform(block: Tensor, num_rows: int) -> None:
    # xavier_uniform_ of the whole (num_rows, d) table: fan_in d, fan_out
    # num_rows.
    # (torch.nn.init's arithmetic, rounding included).
    bound = math.sqrt(3.0) * math.sqrt(2.0 / float(num_rows + block.size(1)))
    block.uniform_(-bound, bound)


# The initializations draw_rows reproduces a block at a time (None: the
# default of torch.nn.Embedding).
BLOCKWISE_INITS = {None: _normal, torch.nn.init.normal_: _normal,
                   torch.nn.init.xavier_uniform_: _xavier_uniform}


def draw_rows(out: Tensor, num_rows: int, ids: Tensor, init: Optional[
        Callable] = None, block_rows: int = DRAW_BLOCK_ROWS) -> Tensor:
    r"""Fills ``out`` with rows ``ids`` of the table that ``init``
    (``None``/``normal_`` or ``xavier_uniform_``, see
    :data:`BLOCKWISE_INITS`) would draw for a whole ``(num_rows,
    out.size(1))`` CPU tensor from the current random state, holding one
    block of ``block_rows`` rows (a multiple of 16) at a time; the random
    state then stands where the whole draw would leave it.

    On the CPU, ``uniform_`` draws one number per element in order;
    ``normal_`` draws a tensor's uniforms in order, transforms them 16 at a
    time and, when the size is not a multiple of 16, redraws the last 16:
    blocks of a multiple of 16 elements, the last one holding at least 16,
    consume and produce the same numbers (a test checks both against the
    whole draw)."""
    if block_rows % 16:
        raise ValueError(f"draw_rows: block_rows={block_rows} is not a "
                         f"multiple of 16")
    fill = BLOCKWISE_INITS[init]
    ids, order = ids.to(out.device).long().sort()
    cuts = list(range(0, num_rows, block_rows)) + [num_rows]
    if len(cuts) > 2 and num_rows % block_rows:
        del cuts[-2]  # the last block takes the remainder (>= 16 elements)
    bounds = torch.searchsorted(ids, torch.tensor(cuts, device=ids.device))
    for i, (start, end) in enumerate(zip(cuts[:-1], cuts[1:])):
        block = out.new_empty(end - start, out.size(1))
        fill(block, num_rows)
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        out[order[lo:hi]] = block[ids[lo:hi] - start]
    return out


class DistEmbedding(torch.nn.Embedding):
    r"""A ``torch.nn.Embedding(num_nodes, d)`` whose rows are nodes of the
    input graph, sharded by the partition (see the module docs). Built from
    the stock module, whose ``weight`` (the same ``Parameter`` object),
    options and ``requires_grad`` it keeps; with ``graph`` it is sharded at
    once, else on :meth:`shard_` (the converted ``LightGCN`` shards it on
    its first call with a :class:`~pyg_sar.DistGraph`). Until then it is
    the stock module.

    Args:
        embedding (torch.nn.Embedding): The stock table, the same on every
            worker (one row per node of the input graph, in input order).
        graph (DistGraph, optional): The graph whose partition shards it.

    Shapes:
        - **input:** nothing (the local rows), or input-graph node ids of
          any shape :math:`(*)`
        - **output:** :math:`(|\mathcal{V}^{(p)}|, d)`, or :math:`(*, d)`
    """

    def __init__(self, embedding: torch.nn.Embedding,
                 graph: Optional[DistGraph] = None) -> None:
        torch.nn.Module.__init__(self)
        for name in ('num_embeddings', 'embedding_dim', 'padding_idx',
                     'max_norm', 'norm_type', 'scale_grad_by_freq',
                     'sparse'):
            setattr(self, name, getattr(embedding, name))
        self.weight = embedding.weight
        self.training = embedding.training
        self.graph: Optional[DistGraph] = None
        self._local_padding: Optional[int] = None
        if graph is not None:
            self.shard_(graph)

    @property
    def sharded(self) -> bool:
        """Whether this worker holds only its own rows."""
        return self.graph is not None

    def shard_(self, graph: DistGraph, init: Optional[Callable] = None
               ) -> 'DistEmbedding':
        """Keeps only the rows of ``graph``'s local nodes, in place (the
        ``Parameter`` object stays, so an optimizer built before still
        holds it; shard before its first step). Again with the same
        partition: nothing to do.

        A table built on the ``meta`` device (``torch.nn.Embedding(n, d,
        device='meta')``: the whole table never exists) gets its local rows
        of ``init``'s stock draw (:meth:`reset_parameters`), on the graph's
        device, in a new ``Parameter``; memory per worker stays about
        ``n / N`` rows throughout."""
        if self.graph is not None:
            self._check_graph(graph)
            return self
        if not isinstance(graph, DistGraph) or graph.is_bipartite:
            raise TypeError(f"DistEmbedding: shards by a homogeneous "
                            f"DistGraph (got {type(graph).__name__})")
        if self.num_embeddings != graph.num_global_nodes:
            raise ValueError(
                f"DistEmbedding: the table has num_embeddings="
                f"{self.num_embeddings} rows but the graph has "
                f"{graph.num_global_nodes} nodes; a node-embedding table "
                f"needs one row per node of the whole graph")
        if self.weight.grad is not None:
            raise RuntimeError("DistEmbedding: shard the table before its "
                               "first backward (it has a gradient of the "
                               "whole table)")
        ids = _input_ids(graph)
        meta = self.weight.is_meta
        if meta:
            # Built under torch.device('meta'): the whole table never
            # existed; this worker's rows of the stock initialization are
            # drawn below.
            self.weight = torch.nn.Parameter(
                torch.empty(ids.numel(), self.embedding_dim,
                            dtype=self.weight.dtype, device=graph.device),
                requires_grad=self.weight.requires_grad)
        else:
            ids = ids.to(self.weight.device)
            with torch.no_grad():
                self.weight.data = self.weight.data[ids].contiguous()
        self.weight.sar_sharded = True
        self.graph = graph
        if self.padding_idx is not None:
            pad = self.padding_idx % self.num_embeddings
            at = (ids == pad).nonzero().view(-1)
            self._local_padding = int(at[0]) if at.numel() else None
        if meta:
            self.reset_parameters(init)
        return self

    def _check_graph(self, graph) -> None:
        if graph is self.graph:
            return
        same = (isinstance(graph, DistGraph) and
                graph.num_global_nodes == self.graph.num_global_nodes and
                graph.node_offset == self.graph.node_offset and
                torch.equal(_input_ids(graph).cpu(),
                            _input_ids(self.graph).cpu()))
        if not same:
            raise ValueError("DistEmbedding: called with a graph of another "
                             "partition than the one its rows were sharded "
                             "by")

    def reset_parameters(self, init: Optional[Callable] = None) -> None:
        """Draws the stock table's initialization (``init``, default
        ``normal_`` with the padding row zeroed, as ``Embedding``) and keeps
        the local rows, so with the same random state every worker gets its
rows of the single-process table. On a CPU table of
        ``float32``/``float64``, ``normal_`` and ``xavier_uniform_`` draw
        the table a block of rows at a time (:func:`draw_rows`: the same
        numbers, one block in memory); another ``init``, device or dtype
        draws the whole table once (a temporary of ``num_embeddings``
        rows)."""
        if self.graph is None:
            if init is None:
                return super().reset_parameters()
            return init(self.weight)
        ids = _input_ids(self.graph).to(self.weight.device)
        if init in BLOCKWISE_INITS and self.weight.device.type == 'cpu' \
                and self.weight.dtype in (torch.float32, torch.float64):
            with torch.no_grad():
                draw_rows(self.weight, self.num_embeddings, ids, init)
                if init is None and self._local_padding is not None:
                    self.weight[self._local_padding].fill_(0)
            return
        full = self.weight.new_empty(self.num_embeddings, self.embedding_dim)
        if init is None:
            torch.nn.init.normal_(full)
            if self.padding_idx is not None:
                full[self.padding_idx].fill_(0)
        else:
            init(full)
        with torch.no_grad():
            self.weight.copy_(full[ids])

    def forward(self, input: Optional[Tensor] = None) -> Tensor:
        if input is None:
            return self.weight
        if self.graph is None:
            return super().forward(input)
        ids = global_ids(self.graph, input)
        rows = self.fetch(ids.reshape(-1))
        return rows.view(*input.shape, self.embedding_dim)

    def fetch(self, ids: Tensor) -> Tensor:
        """The rows of global (partition) node ids ``ids`` (1-D), from their
        owners; differentiable. Collective."""
        plan = node_plan(self.graph, ids)
        peers = sorted(plan.send_idx)
        # Every row this worker hands out, read once through F.embedding
        # (its gradient: sparse with sparse=True; max_norm and
        # scale_grad_by_freq see every lookup of the row, as on one
        # process).
        read = torch.cat([plan.local_src] + [plan.send_idx[q]
                                             for q in peers])
        rows = F.embedding(read.to(self.weight.device), self.weight,
                           self._local_padding, self.max_norm,
                           self.norm_type, self.scale_grad_by_freq,
                           self.sparse)
        start = int(plan.local_src.numel())
        send: Dict[int, Tensor] = {}
        for q in peers:
            n = int(plan.send_idx[q].numel())
            send[q] = torch.arange(start, start + n,
                                   device=plan.local_src.device)
            start += n
        local = torch.arange(int(plan.local_src.numel()),
                             device=plan.local_src.device)
        return fetch_rows(RowPlan(plan.num_out, local, plan.local_dst, send,
                                  plan.recv_pos), rows)

    def full_weight(self) -> Tensor:
        """The whole stock table, in input-graph order, on every worker
        (``num_embeddings`` rows: not 1/N). Collective."""
        if self.graph is None:
            return self.weight.detach().clone()
        full = self.weight.new_zeros(self.num_embeddings, self.embedding_dim)
        full[_input_ids(self.graph).to(full.device)] = self.weight.detach()
        return comm.all_reduce(full, 'sum')

    @staticmethod
    def full_state_dict(model: torch.nn.Module) -> Dict[str, Tensor]:
        """``model.state_dict()`` with the whole stock table in place of
        every sharded :class:`DistEmbedding`'s rows: the state_dict of the
        stock model, loadable into it (or into the converted model on any
        number of workers). Collective."""
        state = model.state_dict()
        for name, module in model.named_modules():
            if isinstance(module, DistEmbedding):
                key = f'{name}.weight' if name else 'weight'
                state[key] = module.full_weight()
        return state

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.graph is not None and self.graph.num_nodes == \
                self.num_embeddings:  # every node here: input order
            w = destination[prefix + 'weight'].detach()
            full = torch.empty_like(w)
            full[_input_ids(self.graph).to(w.device)] = w
            destination[prefix + 'weight'] = full

    def _load_from_state_dict(self, state_dict, prefix, local_metadata,
                              strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        key = prefix + 'weight'
        if self.graph is not None and key in state_dict:
            w = state_dict[key]
            if w.dim() != 2 or tuple(w.shape) != (self.num_embeddings,
                                                  self.embedding_dim):
                error_msgs.append(
                    f"DistEmbedding {key}: expects the stock table of shape "
                    f"({self.num_embeddings}, {self.embedding_dim}) in "
                    f"input-graph order (DistEmbedding.full_state_dict), "
                    f"got {tuple(w.shape)}; a shard of one worker is not "
                    f"loaded")
                return
            state_dict = dict(state_dict)
            state_dict[key] = w[_input_ids(self.graph).to(w.device)]
        super()._load_from_state_dict(state_dict, prefix, local_metadata,
                                      strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self) -> str:
        where = (f', {self.weight.size(0)} local rows' if self.graph
                 is not None else '')
        return super().extra_repr() + where
