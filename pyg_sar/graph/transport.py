"""The transport of one propagation: source rows to the edge blocks that
read them, and their gradients back to the rows' owners.

A layer's propagation visits the edge blocks of its :class:`DistGraph` one
source partition at a time (ring order: in round ``r`` a worker sends its rows
to ``rank + r`` and receives from ``rank - r``) and frees each block's fetched
rows before the next arrive; ``one_shot`` instead fetches all remote rows in
one exchange (the halo table) and sees one merged block. Each round moves a
peer's rows in halo slices of at most ``slice_rows`` rows
(:meth:`EdgeBlock.sliced`), so one or two slices are in flight, not whole
tables. In backward, the gradient of each block's source rows goes back to
their owner, which sums what all peers send into the gradient of its own
rows (:meth:`Transport.route`).

The engine's aggregators (:mod:`pyg_sar.nn.engine`) see only
``(block, tables)`` pairs and return per-block source gradients; how rows
travel is decided here, with the graph that owns the blocks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence,
                    Tuple)

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.comm.buffers import gather_rows, rows_shape
from pyg_sar.graph.blocks import EdgeBlock
from pyg_sar.utils.malloc import trim_heap

# A re-fetch and a gradient send-back between the same two ranks can be in
# flight together, so the send-back has its own channel (a process group).
GRAD_CHANNEL = 'gradients'

# Row shape, dtype and device of a source table.
RowMeta = Tuple[torch.Size, torch.dtype, torch.device]
BlockGrad = Callable[[EdgeBlock, Optional[List[Tensor]]], List[Tensor]]


# The graph's blocks and its row exchange #####################################

def remote_block(graph, peer: int) -> Optional[EdgeBlock]:
    """The block of ``graph``'s edges whose sources ``peer`` owns."""
    for block in graph.blocks[1:]:
        if block.peer == peer:
            return block
    return None


def merged_block(graph) -> EdgeBlock:
    """All edges of ``graph`` as one block over the table ``[local rows;
    halo rows of each remote block in ring order]`` (the ``one_shot``
    layout), built once per graph."""
    if graph.merged_cache is None:
        srcs, offset = [], 0
        for block in graph.blocks:
            srcs.append(block.src + offset)
            offset += block.num_src
        src = torch.cat(srcs)
        dst = torch.cat([b.dst for b in graph.blocks])
        pos = torch.cat([b.edge_pos for b in graph.blocks])
        order = torch.argsort(dst, stable=True)
        graph.merged_cache = EdgeBlock(
            graph.rank, offset, src[order], dst[order], pos[order],
            graph.num_nodes, graph.chunk_size)
    return graph.merged_cache


def post_row_exchange(graph, tensors: List[Tensor], send_to, recv_from,
                      send_rows: Optional[Tuple[int, int]] = None,
                      recv_rows: Optional[Tuple[int, int]] = None,
                      heads_first: Sequence[bool] = ()
                      ) -> comm.PendingExchange:
    """Posts ``graph``'s row exchange for per-node ``tensors``: to each peer
    in ``send_to`` the rows ``send_ids[peer]``, and from each peer in
    ``recv_from`` the rows ``recv_ids[peer]`` of its tensors (same row shape
    and dtype). Peers without rows in the plan are skipped. ``send_rows`` /
    ``recv_rows`` (``(start, stop)``) exchange only that range of those
    lists (a halo slice). A tensor ``k`` with ``heads_first[k]`` (rows
    ``[H, C]``) travels and arrives head-major, ``[H, rows, C]``, as the
    attention value path reads it."""
    def ids(table: Dict[int, Tensor], q: int, rows) -> Tensor:
        return table[q] if rows is None else table[q][rows[0]:rows[1]]

    flags = list(heads_first) + [False] * (len(tensors) - len(heads_first))
    sends = {q: [gather_rows(t, ids(graph.send_ids, q, send_rows), hf)
                 for t, hf in zip(tensors, flags)]
             for q in send_to if q in graph.send_ids}

    def received(q: int) -> list:
        rows = int(ids(graph.recv_ids, q, recv_rows).numel())
        return [(rows_shape(rows, t.shape[1:], hf), t.dtype)
                for t, hf in zip(tensors, flags)]

    shapes = {q: received(q) for q in recv_from if q in graph.recv_ids}
    return comm.post_exchange(sends, shapes, tensors[0].device)


def index_add_rows(target: Tensor, index: Tensor, value: Tensor) -> None:
    """``target.index_add_(0, index, value)``; a row-major view of
    head-major memory is added into along its heads' rows instead (CPU
    ``index_add_`` into a strided view is several times slower)."""
    if target.dim() > 2 and not target.is_contiguous() and \
            target.transpose(0, 1).is_contiguous():
        target.transpose(0, 1).index_add_(1, index, value.transpose(0, 1))
    else:
        target.index_add_(0, index, value)


# The ring ####################################################################

@dataclass
class _Step:
    """One exchange of the ring: a worker sends rows ``send`` (``(start,
    stop)`` of ``send_ids[to]``, or ``None``) to ``to`` and receives rows
    ``recv`` of ``recv_ids[frm]`` from ``frm``, the source table of halo
    slice ``block`` (``None`` when it only sends)."""
    to: int
    frm: int
    send: Optional[Tuple[int, int]]
    recv: Optional[Tuple[int, int]]
    block: Optional[EdgeBlock]


def _row_slices(num_rows: int, rows: Optional[int]) -> List[Tuple[int, int]]:
    if num_rows == 0:
        return []
    if rows is None:
        return [(0, num_rows)]
    return [(a, min(a + rows, num_rows)) for a in range(0, num_rows, rows)]


class Transport:
    """Moves one propagation's source tables over ``graph``: the blocks with
    their tables in forward (:meth:`blocks`), the blocks' source gradients
    back to their owners in backward (:meth:`route`), summed into the
    gradient of each local source table (:meth:`source_grads`).

    Args:
        graph: the :class:`DistGraph` whose blocks are visited.
        meta: ``(row shape, dtype, device)`` of each source table.
        heads_first: tables that travel head-major (``[H, rows, C]``): the
            attention value table, whose per-head products read it so.
        slice_rows: rows per halo slice (``None``: one exchange per peer).
        keep_halo: ``one_shot`` keeps its halo table for the backward.
        sends_grads: whether any source table needs a gradient (every rank
            runs the same model, so all agree).
    """

    def __init__(self, graph, meta: List[RowMeta], heads_first: List[bool],
                 slice_rows: Optional[int] = None, keep_halo: bool = False,
                 sends_grads: bool = True) -> None:
        self.graph = graph
        self.mode = graph.mode
        self.meta = meta
        self.heads_first = heads_first
        self.slice_rows = slice_rows
        self.keep_halo = keep_halo
        self.sends_grads = sends_grads
        self.halo: Optional[List[Tensor]] = None
        self.grads: List[Optional[Tensor]] = [None] * len(meta)

    # Forward #################################################################

    def blocks(self, sources: List[Tensor]
               ) -> Iterator[Tuple[EdgeBlock, List[Tensor]]]:
        """Every block with its source tables: one merged block for
        ``one_shot``, else the local block and then the ring's halo
        slices. The caller drops each block's tables before asking for the
        next: the ring posts the next fetch then."""
        g = self.graph
        if self.mode == 'one_shot':
            tables = self._halo_tables(sources)
            if self.keep_halo:
                self.halo = tables  # recomputed from in backward
            yield merged_block(g), tables
            return
        yield g.blocks[0], sources
        for step, box in self._fetched_steps(sources):
            if box:
                tables = box.pop()
                yield step.block, tables
                del tables  # before the next step is posted

    def _rounds(self) -> List[int]:
        """Ring rounds in which this worker sends or receives anything; the
        peers of a round agree on it, so empty rounds cost nothing."""
        g = self.graph
        P = g.world_size
        return [r for r in range(1, P)
                if (g.rank - r) % P in g.recv_ids
                or (g.rank + r) % P in g.send_ids]

    def _steps(self) -> List[_Step]:
        """The ring's exchanges in order: per active round, one step per
        halo slice of the larger side. A sender and its receiver cut the
        same row list with the same slice size, so they agree."""
        g, P = self.graph, self.graph.world_size
        rows = self.slice_rows
        steps = []
        for rnd in self._rounds():
            to, frm = (g.rank + rnd) % P, (g.rank - rnd) % P
            sends = _row_slices(int(g.send_ids[to].numel())
                                if to in g.send_ids else 0, rows)
            recvs = _row_slices(int(g.recv_ids[frm].numel())
                                if frm in g.recv_ids else 0, rows)
            blocks = (remote_block(g, frm).sliced(rows) if recvs else [])
            for k in range(max(len(sends), len(recvs))):
                steps.append(_Step(
                    to, frm, sends[k] if k < len(sends) else None,
                    recvs[k] if k < len(recvs) else None,
                    blocks[k] if k < len(recvs) else None))
        return steps

    def _swap_heads(self, tensors: List[Tensor]) -> List[Tensor]:
        """Source tables (or their gradients) with the head-major ones
        seen the other way round: the row-major view of a head-major
        arrival, or the head-major memory behind a row-major view (what
        travels)."""
        return [t.transpose(0, 1) if hf else t
                for t, hf in zip(tensors, self.heads_first)]

    def _fetched_steps(self, sources: List[Tensor]
                       ) -> Iterator[Tuple[_Step, List[List[Tensor]]]]:
        """Yields ``(step, box)`` for every step of the ring: ``box`` holds
        the step's source tables (empty in a step where this worker only
        sends), and the caller takes them out (``box.pop()``), so that its
        ``del`` frees them: the generator keeps no reference while the
        caller goes on with the step. Once a step's rows are here, the next
        ``pipeline_depth`` steps are posted: they travel while this one is
        computed. The previous step's rows are gone by then (callers drop
        them before asking for the next step), so at most
        ``pipeline_depth + 1`` steps' buffers exist at once."""
        steps = self._steps()
        depth = comm.config().pipeline_depth
        pending: Dict[int, Any] = {}

        def post(step: _Step):
            return post_row_exchange(
                self.graph, sources, [step.to] if step.send else [],
                [step.frm] if step.recv else [], step.send, step.recv,
                self.heads_first)

        for k, step in enumerate(steps):
            if k not in pending:
                pending[k] = post(step)
            received = pending.pop(k).wait()
            box = ([self._swap_heads(received[step.frm])]
                   if step.block is not None else [])
            del received
            for ahead in range(k + 1, min(k + 1 + depth, len(steps))):
                if ahead not in pending:
                    pending[ahead] = post(steps[ahead])
            yield step, box
            del box

    def _halo_tables(self, sources: List[Tensor]) -> List[Tensor]:
        """``one_shot``: all remote rows in one exchange, stacked after the
        local rows in block order."""
        g = self.graph
        received = post_row_exchange(g, sources, g.send_ids,
                                     g.recv_ids).wait()
        return [torch.cat([sources[k]] +
                          [received[b.peer][k] for b in g.blocks[1:]])
                for k in range(len(sources))]

    # Backward ################################################################

    def zeros(self, num_rows: int, k: int) -> Tensor:
        """Zeros shaped like ``num_rows`` rows of source table ``k``; for a
        head-major table, a row-major view of head-major memory, which the
        per-head products add into."""
        row, dtype, device = self.meta[k]
        hf = self.heads_first[k]
        zeros = torch.zeros(rows_shape(num_rows, row, hf), dtype=dtype,
                            device=device)
        return zeros.transpose(0, 1) if hf else zeros

    def add_rows(self, k: int, value: Tensor,
                 index: Optional[Tensor] = None) -> None:
        """Adds ``value`` to the gradient of local source table ``k`` (at
        rows ``index``; all rows without). A fresh full-size ``value``
        becomes the gradient itself."""
        current = self.grads[k]
        if index is None and current is None:
            self.grads[k] = value
        elif index is None:
            current += value
        else:
            if current is None:
                current = self.grads[k] = self.zeros(
                    self.graph.num_src_nodes, k)
            index_add_rows(current, index, value)

    def source_grads(self) -> List[Tensor]:
        """The gradient of every local source table (zeros where no block
        read it)."""
        return [self.zeros(self.graph.num_src_nodes, k) if grad is None
                else grad for k, grad in enumerate(self.grads)]

    def route(self, block_grad: BlockGrad,
              sources: Optional[List[Tensor]] = None,
              refetch: bool = False) -> None:
        """Computes every block's source-row gradients with
        ``block_grad(block, tables)`` and routes them: local rows directly,
        remote rows back to their owner (in round ``r`` to ``rank - r``,
        while ``rank + r`` sends mine), one halo slice per step. With
        ``refetch``, each step first fetches the slice's rows of
        ``sources`` again (``sar``); without, ``tables`` is ``None`` for
        remote blocks. ``one_shot`` passes its kept halo table."""
        g = self.graph
        if self.mode == 'one_shot':
            table_grads = block_grad(merged_block(g), self.halo)
            self.halo = None
            for k, tg in enumerate(table_grads):
                self.add_rows(k, tg[:g.num_src_nodes].clone())
            sends, offset = {}, g.num_src_nodes
            for block in g.blocks[1:]:
                sends[block.peer] = [tg[offset:offset + block.num_src]
                                     for tg in table_grads]
                offset += block.num_src
            expect = {q: (0, int(ids.numel()))
                      for q, ids in g.send_ids.items()}
            self._receive_grads(self._post_grads(sends, expect), expect)
            return
        for k, tg in enumerate(block_grad(g.blocks[0], sources)):
            self.add_rows(k, tg)
        # The local block's per-chunk temporaries (its edges are most of a
        # worker's) go back to the OS before the ring's buffers arrive.
        trim_heap()
        steps = (self._fetched_steps(sources) if refetch else
                 ((step, []) for step in self._steps()))
        for step, box in steps:
            tables = box.pop() if box else None
            sends = ({step.frm: block_grad(step.block, tables)}
                     if step.block is not None else {})
            # The re-fetched rows go before the gradient exchange is posted:
            # its receive buffers can take their place.
            del tables
            expect = {step.to: step.send} if step.send else {}
            pending = self._post_grads(sends, expect)
            del sends
            # The step's gradient exchange ends before the next step is
            # fetched, so its buffers never overlap the next step's (the
            # pending exchange holds the received rows: it goes too).
            self._receive_grads(pending, expect)
            del pending

    def _post_grads(self, sends: Dict[int, List[Tensor]],
                    expect: Dict[int, Tuple[int, int]]):
        """Posts gradient rows to their owners and the receipt of those of
        my rows ``expect[peer]`` (``(start, stop)`` of ``send_ids[peer]``)
        that ``peer`` computed."""
        if not self.sends_grads:  # every rank runs the same model
            sends, expect = {}, {}
        # A head-major table's gradient travels head-major, as it is built.
        sends = {q: self._swap_heads(tensors)
                 for q, tensors in sends.items()}
        shapes = {q: [(rows_shape(stop - start, row, hf), dtype)
                      for (row, dtype, _), hf in zip(self.meta,
                                                     self.heads_first)]
                  for q, (start, stop) in expect.items()}
        return comm.post_exchange(sends, shapes, self.meta[0][2],
                                  GRAD_CHANNEL)

    def _receive_grads(self, pending, expect: Dict[int, Tuple[int, int]]
                       ) -> None:
        received = pending.wait()
        for frm, rows in received.items():
            start, stop = expect[frm]
            ids = self.graph.send_ids[frm][start:stop]
            for k, r in enumerate(self._swap_heads(rows)):
                self.add_rows(k, r, ids)
