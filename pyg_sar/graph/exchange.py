"""Differentiable row exchanges between workers.

A :class:`RowPlan` says which rows of a per-worker tensor go to which peer and
where the rows that arrive are placed in the output. :func:`fetch_rows` runs
it as an autograd function: the forward is one exchange of rows, the backward
the same exchange reversed, with the gradients of every copy of a row summed
at its owner. The halo of a :class:`~pyg_sar.DistGraph` (the source rows of
remote in-edges) and the edge values of a reversed graph are two such plans.

All communication goes through :mod:`pyg_sar.comm`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pyg_sar import comm


@dataclass
class RowPlan:
    """Where the rows of an input tensor go.

    Args:
        num_out: Rows of the output.
        local_src: Input rows kept on this worker ...
        local_dst: ... and their positions in the output.
        send_idx: ``{peer: input rows sent to peer}``, in the order the peer
            expects them.
        recv_pos: ``{peer: output positions of the rows it sends}``.
        concat: The peers, in order, when the output is every input row
            in order followed by the rows of each of these peers in turn
            (``local_src`` and ``local_dst`` the identity, ``recv_pos``
            consecutive ranges in this order, every output row filled): the
            halo layout. The exchange then runs without index arithmetic
            (concatenation forward, slices backward). ``None``: any plan.

    Output rows that no entry fills are zero. Both sides of every pair of
    peers must hold matching plans (the same counts in the same order).
    """
    num_out: int
    local_src: Tensor
    local_dst: Tensor
    send_idx: Dict[int, Tensor]
    recv_pos: Dict[int, Tensor]
    concat: Optional[List[int]] = None

    def num_received(self) -> int:
        return sum(int(p.numel()) for p in self.recv_pos.values())


def _exchange(sends: Dict[int, Tensor], counts: Dict[int, int],
              like: Tensor) -> Dict[int, Tensor]:
    shapes = {q: [((n, *like.shape[1:]), like.dtype)]
              for q, n in counts.items()}
    received = comm.post_exchange({q: [t] for q, t in sends.items()}, shapes,
                                  like.device).wait()
    return {q: rows[0] for q, rows in received.items()}


def _on(index: Tensor, device: torch.device) -> Tensor:
    return index if index.device == device else index.to(device)


def _fetch(plan: RowPlan, table: Tensor) -> Tensor:
    """Output rows of ``plan`` from the input rows ``table``."""
    dev = table.device
    sends = {q: table.index_select(0, _on(idx, dev))
             for q, idx in plan.send_idx.items()}
    counts = {q: int(pos.numel()) for q, pos in plan.recv_pos.items()}
    received = _exchange(sends, counts, table)
    if plan.concat is not None:
        n = int(plan.local_src.numel())
        if table.shape[0] < n:
            raise ValueError(f"fetch_rows: the table has {table.shape[0]} "
                             f"rows; expected at least {n}")
        return torch.cat([table.narrow(0, 0, n)] +
                         [received[q] for q in plan.concat])
    out = table.new_zeros((plan.num_out, *table.shape[1:]))
    out.index_copy_(0, _on(plan.local_dst, dev),
                    table.index_select(0, _on(plan.local_src, dev)))
    for q, rows in received.items():
        out.index_copy_(0, _on(plan.recv_pos[q], dev), rows)
    return out


def _push(plan: RowPlan, rows: Tensor, num_rows: int) -> Tensor:
    """The transpose of :func:`_fetch`: output rows go back to the input
    row they came from and are summed there."""
    dev = rows.device
    if plan.concat is not None:
        # The halo layout: each peer's rows are one slice, the local rows
        # the first n (0 + x is x: the same values as index_add_).
        n_local = int(plan.local_src.numel())
        sends, start = {}, n_local
        for q in plan.concat:
            n = int(plan.recv_pos[q].numel())
            sends[q] = rows.narrow(0, start, n)
            start += n
    else:
        sends = {q: rows.index_select(0, _on(pos, dev))
                 for q, pos in plan.recv_pos.items()}
    counts = {q: int(idx.numel()) for q, idx in plan.send_idx.items()}
    received = _exchange(sends, counts, rows)
    if plan.concat is not None and num_rows == n_local:
        out = rows[:num_rows].clone(memory_format=torch.contiguous_format)
    elif plan.concat is not None:
        out = rows.new_zeros((num_rows, *rows.shape[1:]))
        out[:n_local] = rows[:n_local]
    else:
        out = rows.new_zeros((num_rows, *rows.shape[1:]))
        out.index_add_(0, _on(plan.local_src, dev),
                       rows.index_select(0, _on(plan.local_dst, dev)))
    for q, got in received.items():
        out.index_add_(0, _on(plan.send_idx[q], dev), got)
    return out


class _FetchRows(torch.autograd.Function):

    @staticmethod
    def forward(ctx, plan: RowPlan, table: Tensor) -> Tensor:
        ctx.plan, ctx.num_rows = plan, table.shape[0]
        return _fetch(plan, table)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        return None, _push(ctx.plan, grad, ctx.num_rows)


class _PushRows(torch.autograd.Function):

    @staticmethod
    def forward(ctx, plan: RowPlan, rows: Tensor, num_rows: int) -> Tensor:
        ctx.plan = plan
        return _push(plan, rows, num_rows)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        return None, _fetch(ctx.plan, grad), None


def push_rows(plan: RowPlan, rows: Tensor, num_rows: int) -> Tensor:
    """The transpose of :func:`fetch_rows`: every output row of ``plan`` is
    added to the input row it was fetched from (``num_rows`` of them).
    Differentiable; collective."""
    return _PushRows.apply(plan, rows, num_rows)


def fetch_rows(plan: RowPlan, table: Tensor, dim: int = 0) -> Tensor:
    """Runs ``plan`` on the rows (dimension ``dim``) of ``table``;
    differentiable. Collective over the peers of the plan."""
    if dim != 0 and dim != -table.dim():
        moved = table.movedim(dim, 0)
        return fetch_rows(plan, moved).movedim(0, dim)
    return _FetchRows.apply(plan, table)
