"""Ring scheduling: fetching source rows and routing their gradients back.

A layer's propagation visits the edge blocks of its :class:`DistGraph` one
source partition at a time (ring order: in round ``r`` a worker sends its rows
to ``rank + r`` and receives from ``rank - r``), aggregates each block into a
running result, and frees the fetched rows; ``one_shot`` instead fetches all
remote rows in one exchange (the halo table). Gradients of remote source rows
go back to their owners, which sum what all peers send. Each round moves a
peer's rows in halo slices of at most ``halo_slice_bytes``
(:meth:`EdgeBlock.sliced`), so one or two slices are in flight, not whole
tables.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.utils.malloc import trim_heap
from pyg_sar.comm.buffers import rows_shape
from pyg_sar.graph.blocks import power_of_two_at_most
from pyg_sar.graph.blocks import EdgeBlock

# A re-fetch and a gradient send-back between the same two ranks can be in
# flight together, so the send-back has its own channel (a process group).
_GRAD_CHANNEL = 'gradients'
# At least one row per slice, however wide the rows.
_MIN_SLICE_ROWS = 1


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


class RingMixin:
    """Owns the runner's ring: active rounds and their halo-slice steps,
    pipelined fetches (``_fetched_steps``), the ``one_shot`` halo table, the
    block iterator of every forward (``_blocks``), and the send-back of
    source-row gradients (``_route``, ``_post_grads``, ``_receive_grads``).
    """

    # Fetching ################################################################

    def _rounds(self) -> List[int]:
        """Ring rounds in which this worker sends or receives anything; the
        peers of a round agree on it, so empty rounds cost nothing."""
        g = self.graph
        P = g.world_size
        return [r for r in range(1, P)
                if (g.rank - r) % P in g.recv_ids
                or (g.rank + r) % P in g.send_ids]

    def _slice_rows(self) -> Optional[int]:
        """Rows per halo slice of the sparse linear path: a power of two
        (layers of similar widths then share one cut of the blocks) whose
        rows of every source tensor fit ``halo_slice_bytes``; ``None`` when
        slicing is off or the layer is not linear. Every rank derives the
        same value from the same model."""
        budget = comm.config().halo_slice_bytes
        if not budget or self.plan.kind != 'spmm':
            # Sparse products add each slice into the output in place; the
            # per-edge kinds would rebuild destination-sized temporaries per
            # slice (e.g. GAT's per-head products): one exchange per peer.
            return None
        row_bytes = sum(math.prod(shape) * dtype.itemsize
                        for shape, dtype, _ in self.source_meta)
        return power_of_two_at_most(
            max(_MIN_SLICE_ROWS, budget // max(row_bytes, 1)))

    def _steps(self) -> List[_Step]:
        """The ring's exchanges in order: per active round, one step per
        halo slice of the larger side. A sender and its receiver cut the
        same row list with the same slice size, so they agree."""
        g, P = self.graph, self.graph.world_size
        rows = self._slice_rows()
        steps = []
        for rnd in self._rounds():
            to, frm = (g.rank + rnd) % P, (g.rank - rnd) % P
            sends = _row_slices(int(g.send_ids[to].numel())
                                if to in g.send_ids else 0, rows)
            recvs = _row_slices(int(g.recv_ids[frm].numel())
                                if frm in g.recv_ids else 0, rows)
            blocks = (g.remote_block(frm).sliced(rows) if recvs else [])
            for k in range(max(len(sends), len(recvs))):
                steps.append(_Step(
                    to, frm, sends[k] if k < len(sends) else None,
                    recvs[k] if k < len(recvs) else None,
                    blocks[k] if k < len(recvs) else None))
        return steps

    def _swap_heads(self, tensors: List[Tensor]) -> List[Tensor]:
        """Source tables (or their gradients) with the head-major ones
        (``heads_first``) seen the other way round: the row-major view of a
        head-major arrival, or the head-major memory behind a row-major
        view (what travels)."""
        return [t.transpose(0, 1) if hf else t
                for t, hf in zip(tensors, self.heads_first)]

    def _post_fetch(self, step: _Step):
        return self.graph.post_row_exchange(
            self.sources, [step.to] if step.send else [],
            [step.frm] if step.recv else [], step.send, step.recv,
            self.heads_first)

    def _fetched_steps(self) -> Iterator[Tuple[_Step, List[List[Tensor]]]]:
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
        for k, step in enumerate(steps):
            if k not in pending:
                pending[k] = self._post_fetch(step)
            received = pending.pop(k).wait()
            box = ([self._swap_heads(received[step.frm])]
                   if step.block is not None else [])
            del received
            for ahead in range(k + 1, min(k + 1 + depth, len(steps))):
                if ahead not in pending:
                    pending[ahead] = self._post_fetch(steps[ahead])
            yield step, box
            del box

    def _halo_tables(self) -> List[Tensor]:
        """``one_shot``: all remote rows in one exchange, stacked after the
        local rows in block order."""
        g, sources = self.graph, self.sources
        received = g.post_row_exchange(sources, g.send_ids,
                                       g.recv_ids).wait()
        return [torch.cat([sources[k]] +
                          [received[b.peer][k] for b in g.blocks[1:]])
                for k in range(len(sources))]

    def _blocks(self) -> Iterator[Tuple[EdgeBlock, List[Tensor]]]:
        """Every block with its source tables: one merged block for
        ``one_shot``, else the local block and then the ring's halo
        slices."""
        if self.mode == 'one_shot':
            tables = self._halo_tables()
            if self.plan.kind in ('general', 'attention'):
                self.state['halo'] = tables  # recomputed from in backward
            yield self.graph.merged_block(), tables
            return
        yield self.graph.local_block, self.sources
        for step, box in self._fetched_steps():
            if box:
                tables = box.pop()
                yield step.block, tables
                del tables  # before the next step is posted

    # Gradient routing ########################################################

    def _post_grads(self, sends: Dict[int, List[Tensor]],
                    expect: Dict[int, Tuple[int, int]]):
        """Posts gradient rows to their owners and the receipt of those of
        my rows ``expect[peer]`` (``(start, stop)`` of ``send_ids[peer]``)
        that ``peer`` computed."""
        if not self.any_src_grad:  # every rank runs the same model
            sends, expect = {}, {}
        # The value table's gradient travels head-major, as it is built.
        sends = {q: self._swap_heads(tensors)
                 for q, tensors in sends.items()}
        shapes = {q: [(rows_shape(stop - start, row, hf), dtype)
                      for (row, dtype, _), hf in zip(self.source_meta,
                                                     self.heads_first)]
                  for q, (start, stop) in expect.items()}
        return comm.post_exchange(sends, shapes, self.source_meta[0][2],
                                  _GRAD_CHANNEL)

    def _receive_grads(self, pending, expect: Dict[int, Tuple[int, int]]
                       ) -> None:
        received = pending.wait()
        for frm, rows in received.items():
            start, stop = expect[frm]
            ids = self.graph.send_ids[frm][start:stop]
            for k, r in enumerate(self._swap_heads(rows)):
                self._add_src_rows(k, r, ids)

    def _route(self, block_grad: Callable[[EdgeBlock, Optional[List[Tensor]]],
                                          List[Tensor]],
               refetch: bool = False) -> None:
        """Computes every block's source-row gradients with ``block_grad``
        and routes them: local rows directly, remote rows back to their owner
        (in round ``r`` to ``rank - r``, while ``rank + r`` sends mine), one
        halo slice per step. With ``refetch``, each step first fetches the
        slice's source rows again (``sar``)."""
        g = self.graph
        if self.mode == 'one_shot':
            merged = g.merged_block()
            table_grads = block_grad(merged, self.state.get('halo'))
            for k, tg in enumerate(table_grads):
                self._add_src_rows(k, tg[:g.num_src_nodes].clone())
            sends, offset = {}, g.num_src_nodes
            for block in g.blocks[1:]:
                sends[block.peer] = [tg[offset:offset + block.num_src]
                                     for tg in table_grads]
                offset += block.num_src
            expect = {q: (0, int(ids.numel()))
                      for q, ids in g.send_ids.items()}
            self._receive_grads(self._post_grads(sends, expect), expect)
            return
        for k, tg in enumerate(block_grad(g.local_block, self.sources)):
            self._add_src_rows(k, tg)
        # The local block's per-chunk temporaries (its edges are most of a
        # worker's) go back to the OS before the ring's buffers arrive.
        trim_heap()
        steps = (self._fetched_steps() if refetch else
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
