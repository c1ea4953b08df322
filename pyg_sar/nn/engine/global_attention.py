r"""Exact softmax attention of every node over all nodes of all workers.

.. math::
    \mathbf{o}_i = \sum_{j \,:\, b_j = b_i} \frac{\exp(\mathbf{q}_i^{\top}
    \mathbf{k}_j / \sqrt{d})}{\sum_{l \,:\, b_l = b_i} \exp(\mathbf{q}_i^{\top}
    \mathbf{k}_l / \sqrt{d})} \mathbf{v}_j

per head, where :math:`b` is the graph of a node (one graph without a
``batch`` vector). This is what ``torch.nn.MultiheadAttention`` computes on
PyG's ``to_dense_batch`` output with ``key_padding_mask=~mask`` (the padded
keys never receive weight), between the input and output projections.

Every worker holds the query, key and value rows of its own nodes. The key
and value rows travel around a ring of workers (step ``s``: a worker holds
the rows of rank ``rank - s`` and passes them to ``rank + 1``), and each
arriving block is folded into an online (log-sum-exp) softmax, tile by
tile: key tiles of ``block`` rows, computed by torch's fused CPU attention
kernel (which returns the tile's log-sum-exp and tiles the queries itself)
or, with a ``batch`` mask or on GPU, as explicit score tiles of ``block``
query rows by ``block`` key rows. Nothing of size :math:`N \times N`
exists: a worker's memory is its own rows, two key/value blocks (the one
held and the one arriving) and one tile of scores per head.

The backward pass rematerializes (FlashAttention-2 style): forward saves
only the log-sum-exp per query row and head; backward sends the key and
value blocks around the ring once more, together with their gradient
accumulators, recomputes the probabilities tile by tile from the global
output and log-sum-exp (the fused kernel's backward takes both), and the
last step hands every block's key and value gradients back to its owner.

Extra keys seen by every query (``add_bias_kv``, ``add_zero_attn`` of
``torch.nn.MultiheadAttention``) are a replicated block folded first on every
worker; their gradients are per-worker partial sums, like every parameter
gradient (all-reduced by :func:`pyg_sar.all_reduce_grads`).
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from pyg_sar import comm

__all__ = ['global_attention', 'GlobalAttentionFunction', 'block_rows',
           'fused_available', 'DEFAULT_BLOCK']

# Query and key rows per block without a chunk size: 1024 x 1024 scores per
# head (4 MiB in float32).
DEFAULT_BLOCK = 1024


def block_rows(chunk_size: Optional[int]) -> int:
    """Query (and key) rows per block: ``chunk_size`` bounds the scores of
    one block per head, as it bounds the edges of one chunk in message
    passing (``None``: :data:`DEFAULT_BLOCK` rows)."""
    if chunk_size is None:
        return DEFAULT_BLOCK
    return max(1, math.isqrt(int(chunk_size)))


def _spans(n: int, size: int) -> List[Tuple[int, int]]:
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def _scores(q: Tensor, k: Tensor, scale: float, bq: Optional[Tensor],
            bk: Optional[Tensor]) -> Tensor:
    """``[H, nq, nk]`` scaled scores, ``-inf`` between different graphs."""
    s = torch.bmm(q, k.transpose(1, 2)) * scale
    if bq is not None and bk is not None:
        s = s.masked_fill((bq.view(-1, 1) != bk.view(1, -1)).unsqueeze(0),
                          float('-inf'))
    return s


class _Ring:
    """Passes blocks to ``rank + 1`` and receives from ``rank - 1``;
    ``sizes[r]``: the row count of rank ``r``'s block."""

    def __init__(self, rank: int, world_size: int, sizes: Sequence[int]):
        self.rank, self.P, self.sizes = rank, world_size, list(sizes)

    def owner(self, step: int) -> int:
        """Whose rows a worker holds after ``step`` passes."""
        return (self.rank - step) % self.P

    def post(self, tensors: List[Tensor], step: int):
        """Posts the pass of the block held after ``step`` passes (to
        ``rank + 1``); :meth:`take` returns the rows received from
        ``rank - 1``, those of ``owner(step + 1)``."""
        n = self.sizes[self.owner(step + 1)]
        to, frm = (self.rank + 1) % self.P, (self.rank - 1) % self.P
        recv = [(_row_shape(t, n), t.dtype) for t in tensors]
        return comm.post_exchange({to: tensors}, {frm: recv},
                                  tensors[0].device)

    def take(self, pending) -> List[Tensor]:
        return pending.wait()[(self.rank - 1) % self.P]


def _row_shape(t: Tensor, n: int) -> Tuple[int, ...]:
    """Shape of a received block with ``n`` rows: head-major tensors
    (``[H, n, d]``) have rows on dim 1, row vectors (``batch``) on dim 0."""
    if t.dim() == 1:
        return (n, )
    return (t.shape[0], n) + tuple(t.shape[2:])


_FLASH = getattr(torch.ops.aten, '_scaled_dot_product_flash_attention_for_cpu',
                 None)
_FLASH_BWD = getattr(torch.ops.aten,
                     '_scaled_dot_product_flash_attention_for_cpu_backward',
                     None)


def fused_available(q: Tensor, batch: Optional[Tensor]) -> bool:
    """Whether torch's fused CPU attention kernel (which returns the
    log-sum-exp and takes it back in backward) can compute the tiles: CPU,
    float32/float64, no ``batch`` mask."""
    return (_FLASH is not None and _FLASH_BWD is not None and batch is None
            and q.device.type == 'cpu'
            and q.dtype in (torch.float32, torch.float64))


def _flash(q: Tensor, k: Tensor, v: Tensor, scale: float
           ) -> Tuple[Tensor, Tensor]:
    """Attention of ``q`` over one tile of keys: ``(out, lse)``."""
    out, lse = _FLASH(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                      scale=scale)
    return out[0], lse[0]


def _flash_grads(dO: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                 lse: Tensor, scale: float) -> Tuple[Tensor, Tensor, Tensor]:
    """The tile's share of ``dq`` and its ``dk``, ``dv``, given the
    *global* output and log-sum-exp of every query row."""
    dq, dk, dv = _FLASH_BWD(dO.unsqueeze(0), q.unsqueeze(0), k.unsqueeze(0),
                            v.unsqueeze(0), out.unsqueeze(0),
                            lse.unsqueeze(0), 0.0, False, scale=scale)
    return dq[0], dk[0], dv[0]


class GlobalAttentionFunction(torch.autograd.Function):
    r"""``o = softmax(q k^T / sqrt(d)) v`` over the keys of all workers
    (see the module docs). Inputs are head-major: ``q``, ``k``, ``v``
    ``[H, n, d]`` (local rows), ``batch`` ``[n]`` or ``None``, and the
    replicated extra keys ``ek``, ``ev`` ``[H, E, d]`` or ``None``."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor,
                batch: Optional[Tensor], ek: Optional[Tensor],
                ev: Optional[Tensor], ring: _Ring, block: int,
                fused: bool) -> Tensor:
        H, n, d = q.shape
        scale = 1.0 / math.sqrt(d)
        m = q.new_full((H, n), float('-inf'))
        lsum = q.new_zeros((H, n))
        acc = q.new_zeros((H, n, v.shape[-1]))

        def fold(kb: Tensor, vb: Tensor, bk: Optional[Tensor]) -> None:
            if fused and bk is None:
                for ka, kz in _spans(kb.shape[1] if n else 0, block):
                    o_t, lse_t = _flash(q, kb[:, ka:kz], vb[:, ka:kz], scale)
                    m_new = torch.maximum(m, lse_t)
                    alpha = torch.exp(m - m_new)
                    beta = torch.exp(lse_t - m_new)
                    lsum.mul_(alpha).add_(beta)
                    acc.mul_(alpha.unsqueeze(-1)).add_(
                        o_t * beta.unsqueeze(-1))
                    m.copy_(m_new)
                return
            for qa, qz in _spans(n, block):
                bq = batch[qa:qz] if bk is not None else None
                for ka, kz in _spans(kb.shape[1], block):
                    s = _scores(q[:, qa:qz], kb[:, ka:kz], scale, bq,
                                bk[ka:kz] if bk is not None else None)
                    m_old = m[:, qa:qz]
                    m_new = torch.maximum(m_old, s.amax(-1))
                    safe = torch.where(torch.isinf(m_new),
                                       torch.zeros_like(m_new), m_new)
                    p = torch.exp(s - safe.unsqueeze(-1))
                    alpha = torch.exp(m_old - safe)
                    lsum[:, qa:qz] = lsum[:, qa:qz] * alpha + p.sum(-1)
                    acc[:, qa:qz] = (acc[:, qa:qz] * alpha.unsqueeze(-1) +
                                     torch.bmm(p, vb[:, ka:kz]))
                    m[:, qa:qz] = m_new
                    del s, p

        if ek is not None:
            fold(ek, ev, None)
        held = [k, v] + ([batch] if batch is not None else [])
        for step in range(ring.P):
            pending = (ring.post(held, step) if step < ring.P - 1 else None)
            fold(held[0], held[1], held[2] if batch is not None else None)
            if pending is not None:
                held = ring.take(pending)
        out = acc / lsum.unsqueeze(-1)
        lse = m + torch.log(lsum)
        ctx.save_for_backward(q, k, v, out, lse, batch, ek, ev)
        ctx.ring, ctx.block, ctx.fused = ring, block, fused
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse, batch, ek, ev = ctx.saved_tensors
        ring, block = ctx.ring, ctx.block
        H, n, d = q.shape
        scale = 1.0 / math.sqrt(d)
        dO = grad_out.contiguous()
        D = (dO * out).sum(-1)  # [H, n]
        dq = torch.zeros_like(q)

        def fold(kb: Tensor, vb: Tensor, bk: Optional[Tensor], dk: Tensor,
                 dv: Tensor) -> None:
            if ctx.fused and bk is None:
                for ka, kz in _spans(kb.shape[1] if n else 0, block):
                    dq_t, dk_t, dv_t = _flash_grads(
                        dO, q, kb[:, ka:kz], vb[:, ka:kz], out, lse, scale)
                    dq.add_(dq_t)
                    dk[:, ka:kz] += dk_t
                    dv[:, ka:kz] += dv_t
                return
            for qa, qz in _spans(n, block):
                bq = batch[qa:qz] if bk is not None else None
                for ka, kz in _spans(kb.shape[1], block):
                    kk, vv = kb[:, ka:kz], vb[:, ka:kz]
                    s = _scores(q[:, qa:qz], kk, scale, bq,
                                bk[ka:kz] if bk is not None else None)
                    p = torch.exp(s - lse[:, qa:qz].unsqueeze(-1))
                    g = dO[:, qa:qz]
                    dv[:, ka:kz] += torch.bmm(p.transpose(1, 2), g)
                    ds = p * (torch.bmm(g, vv.transpose(1, 2)) -
                              D[:, qa:qz].unsqueeze(-1))
                    dq[:, qa:qz] += torch.bmm(ds, kk) * scale
                    dk[:, ka:kz] += torch.bmm(ds.transpose(1, 2),
                                              q[:, qa:qz]) * scale
                    del s, p, ds

        dek = dev = None
        if ek is not None:
            dek, dev = torch.zeros_like(ek), torch.zeros_like(ev)
            fold(ek, ev, None, dek, dev)
        held = [k, v, torch.zeros_like(k), torch.zeros_like(v)] + (
            [batch] if batch is not None else [])
        for step in range(ring.P):
            fold(held[0], held[1], held[4] if batch is not None else None,
                 held[2], held[3])
            if step < ring.P - 1:
                held = ring.take(ring.post(held, step))
        dk, dv = held[2], held[3]
        if ring.P > 1:
            # The last pass returns every block's gradients to its owner.
            dk, dv = ring.take(ring.post([dk, dv], ring.P - 1))
        if not ctx.needs_input_grad[4]:
            dek = None
        if not ctx.needs_input_grad[5]:
            dev = None
        return dq, dk, dv, None, dek, dev, None, None, None


def global_attention(q: Tensor, k: Tensor, v: Tensor,
                     batch: Optional[Tensor], node_counts: Sequence[int],
                     block: int, extra_k: Optional[Tensor] = None,
                     extra_v: Optional[Tensor] = None,
                     fused: Optional[bool] = None) -> Tensor:
    r"""Softmax attention of the local queries over the keys and values of
    every worker (within each graph of ``batch``).

    Args:
        q, k, v (torch.Tensor): Local rows, :math:`(n_p, H, d)`.
        batch (torch.Tensor, optional): Graph of every local node,
            :math:`(n_p)`; ``None``: one graph.
        node_counts (Sequence[int]): :math:`n_r` of every rank ``r``.
        block (int): Query and key rows per block of scores.
        extra_k, extra_v (torch.Tensor, optional): Keys and values every
            query sees, :math:`(E, H, d)`, replicated on every worker.
        fused (bool, optional): Compute the tiles with torch's fused CPU
            attention kernel (the default where :func:`fused_available`),
            else with explicit score tiles of ``block`` x ``block``.

    Returns:
        :math:`(n_p, H, d)` attention outputs (before any output
        projection). Collective: every worker calls it.
    """
    world_size = len(node_counts)
    ring = _Ring(comm.get_rank() if world_size > 1 else 0, world_size,
                 node_counts)
    heads = [t.transpose(0, 1).contiguous() if t is not None else None
             for t in (q, k, v, extra_k, extra_v)]
    if batch is not None:
        batch = batch.to(device=q.device, dtype=torch.long).contiguous()
    if fused is None:
        fused = fused_available(q, batch)
    elif fused and not fused_available(q, batch):
        raise ValueError("global_attention: fused=True needs torch's CPU "
                         "flash attention, float32/float64 CPU tensors and "
                         "no batch")
    out = GlobalAttentionFunction.apply(heads[0], heads[1], heads[2], batch,
                                        heads[3], heads[4], ring, block,
                                        fused)
    return out.transpose(0, 1)
