"""Ring scheduling: fetching source rows and routing their gradients back.

A layer's propagation visits the edge blocks of its :class:`DistGraph` one
source partition at a time (ring order: in round ``r`` a worker sends its rows
to ``rank + r`` and receives from ``rank - r``), aggregates each block into a
running result, and frees the fetched rows; ``one_shot`` instead fetches all
remote rows in one exchange (the halo table). Gradients of remote source rows
go back to their owners, which sum what all peers send.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, \
    Tuple

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.graph import EdgeBlock

# A re-fetch and a gradient send-back between the same two ranks can be in
# flight together, so the send-back has its own channel (a process group).
_GRAD_CHANNEL = 'gradients'


class RingMixin:
    """Owns the runner's ring: active rounds, pipelined fetches
    (``_fetched_rounds``), the ``one_shot`` halo table, the block iterator
    of every forward (``_blocks``), and the send-back of source-row
    gradients (``_route``, ``_post_grads``, ``_receive_grads``)."""

    # Fetching ################################################################

    def _rounds(self) -> List[int]:
        """Ring rounds in which this worker sends or receives anything; the
        peers of a round agree on it, so empty rounds cost nothing."""
        g = self.graph
        P = g.world_size
        return [r for r in range(1, P)
                if (g.rank - r) % P in g.recv_ids
                or (g.rank + r) % P in g.send_ids]

    def _post_fetch(self, rnd: int):
        g = self.graph
        to, frm = (g.rank + rnd) % g.world_size, (g.rank - rnd) % g.world_size
        return frm, g.post_row_exchange(self.sources, [to], [frm])

    def _fetched_rounds(self) -> Iterator[Tuple[int, Optional[EdgeBlock],
                                                Optional[List[Tensor]]]]:
        """Yields ``(round, block, tables)`` for every active ring round, with
        ``pipeline_depth`` rounds posted ahead; ``block`` is ``None`` in a
        round where this worker only sends."""
        rounds = self._rounds()
        depth = comm.config().pipeline_depth + 1
        pending: Dict[int, Any] = {}
        for k, rnd in enumerate(rounds):
            for ahead in rounds[k:k + depth]:
                if ahead not in pending:
                    pending[ahead] = self._post_fetch(ahead)
            frm, work = pending.pop(rnd)
            received = work.wait()
            block = self.graph.remote_block(frm)
            yield rnd, block, (received[frm] if block is not None else None)

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
        ``one_shot``, else the local block and then the ring."""
        if self.mode == 'one_shot':
            tables = self._halo_tables()
            if self.plan.kind in ('general', 'attention'):
                self.state['halo'] = tables  # recomputed from in backward
            yield self.graph.merged_block(), tables
            return
        yield self.graph.local_block, self.sources
        for _, block, tables in self._fetched_rounds():
            if block is not None:
                yield block, tables

    # Gradient routing ########################################################

    def _post_grads(self, sends: Dict[int, List[Tensor]],
                    from_peers: Sequence[int]):
        if not self.any_src_grad:  # every rank runs the same model
            sends, from_peers = {}, []
        g = self.graph
        shapes = {q: [((int(g.send_ids[q].numel()), *row), dtype)
                      for row, dtype, _ in self.source_meta]
                  for q in from_peers}
        return comm.post_exchange(sends, shapes, self.source_meta[0][2],
                                  _GRAD_CHANNEL)

    def _receive_grads(self, pending) -> None:
        received = pending.wait()
        for frm, rows in received.items():
            ids = self.graph.send_ids[frm]
            for k, r in enumerate(rows):
                self._add_src_rows(k, r, ids)

    def _route(self, block_grad: Callable[[EdgeBlock, Optional[List[Tensor]]],
                                          List[Tensor]],
               refetch: bool = False) -> None:
        """Computes every block's source-row gradients with ``block_grad``
        and routes them: local rows directly, remote rows back to their owner
        (in round ``r`` to ``rank - r``, while ``rank + r`` sends mine).
        With ``refetch``, each round first fetches the block's source rows
        again (``sar``)."""
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
            self._receive_grads(self._post_grads(sends, list(g.send_ids)))
            return
        for k, tg in enumerate(block_grad(g.local_block, self.sources)):
            self._add_src_rows(k, tg)
        P = g.world_size
        if refetch:
            rounds = ((rnd, block, tables)
                      for rnd, block, tables in self._fetched_rounds())
        else:
            rounds = ((rnd, g.remote_block((g.rank - rnd) % P), None)
                      for rnd in self._rounds())
        pending = None
        for rnd, block, tables in rounds:
            # Finish the previous round's gradient exchange first: its
            # buffers are freed before this round's gradients are built.
            if pending is not None:
                self._receive_grads(pending)
                pending = None
            sends = ({block.peer: block_grad(block, tables)}
                     if block is not None else {})
            frm = (g.rank + rnd) % P
            pending = self._post_grads(sends, [frm] if frm in g.send_ids
                                       else [])
            del sends, tables
        if pending is not None:
            self._receive_grads(pending)
