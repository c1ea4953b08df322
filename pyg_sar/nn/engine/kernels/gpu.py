"""The Triton kernels (same entry points as :mod:`.cpu`; see
:mod:`pyg_sar.nn.engine.kernels`). One program per destination row and head
in forward and in the backward over rows (an online softmax over the row's
edges in blocks of ``BLOCK_E``; no atomics), one per source row and head in
the backward over the transposed chunk. Only the gradient of GATv2's ``att``
(one ``[H, C]`` sum over all edges) is added atomically. On CPU tensors they
run under ``TRITON_INTERPRET=1`` (the tests' correctness check)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_EPS = tl.constexpr(1e-16)  # PyG's softmax normalizer epsilon


def _strides(t: torch.Tensor, dims: int):
    """Node (edge) and head strides of an [N, H(, C)] table, ``(0, 0)`` for
    an absent one."""
    if t.numel() == 0:
        return 0, 0
    return t.stride(0), (t.stride(1) if t.dim() > 1 else 0)


# Launch shape: edges per block and warps per program (None: by the rule
# below). Module settings so that benchmarks/fused_attention.py can sweep
# them. On an H200 (1M rows, 20 edges each, 4 heads x 32 channels) one warp
# per program was fastest for both scores, with blocks of 32 edges (GAT) and
# 16 (GATv2, which also holds the [edges, channels] pre-activation): twice
# as fast as 4 warps and 64 edges.
BLOCK_E = None
NUM_WARPS = None


def _blocks(kind: int, channels: int):
    """``(block_e, block_c, num_warps)`` for a kernel of ``kind``."""
    block_c = triton.next_power_of_2(max(int(channels), 1))
    tile = 1024 if kind == 0 else 512
    block_e = BLOCK_E or max(1, min(32, tile // block_c))
    warps = NUM_WARPS or max(1, min(8, block_c // 64))
    return block_e, block_c, warps


@triton.jit
def _score(ss, ss_n, ss_h, sdi, ed, ed_e, ed_h, a, j, es, emask, cs, cmask,
           h, slope, KIND: tl.constexpr, HAS_EDGE: tl.constexpr):
    """The pre-activation (GAT: [BLOCK_E]; GATv2: [BLOCK_E, BLOCK_C]; dot:
    the keys plus edge terms, [BLOCK_E, BLOCK_C]) and the logits of a block
    of edges (``slope``: the dot score's divisor for KIND 2)."""
    if KIND == 0:
        pre = tl.load(ss + j * ss_n + h * ss_h, mask=emask, other=0.) + sdi
        if HAS_EDGE:
            pre += tl.load(ed + es * ed_e + h * ed_h, mask=emask, other=0.)
        logit = tl.where(pre > 0, pre, pre * slope)
    elif KIND == 2:
        m2 = emask[:, None] & cmask[None, :]
        pre = tl.load(ss + j[:, None] * ss_n + h * ss_h + cs[None, :],
                      mask=m2, other=0.)
        if HAS_EDGE:
            pre += tl.load(ed + es[:, None] * ed_e + h * ed_h + cs[None, :],
                           mask=m2, other=0.)
        logit = tl.sum(pre * sdi[None, :], axis=1) / slope
    else:
        m2 = emask[:, None] & cmask[None, :]
        pre = tl.load(ss + j[:, None] * ss_n + h * ss_h + cs[None, :],
                      mask=m2, other=0.) + sdi[None, :]
        if HAS_EDGE:
            pre += tl.load(ed + es[:, None] * ed_e + h * ed_h + cs[None, :],
                           mask=m2, other=0.)
        logit = tl.sum(tl.where(pre > 0, pre, pre * slope) * a[None, :],
                       axis=1)
    return pre, logit


@triton.jit
def _forward(crow, col, ss, ss_n, ss_h, sd, sd_n, sd_h, ed, ed_e, ed_h, att,
             val, val_n, val_h, mask, mx, sm, out, out_n, out_h, H, C, slope,
             KIND: tl.constexpr, HAS_EDGE: tl.constexpr,
             HAS_MASK: tl.constexpr, BLOCK_E: tl.constexpr,
             BLOCK_C: tl.constexpr):
    slope = tl.load(slope)
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    e0 = tl.load(crow + i).to(tl.int64)
    e1 = tl.load(crow + i + 1).to(tl.int64)
    cs = tl.arange(0, BLOCK_C)
    cmask = cs < C
    m = tl.load(mx + i * H + h)
    s = tl.load(sm + i * H + h)
    acc = tl.load(out + i * out_n + h * out_h + cs, mask=cmask, other=0.)
    if KIND == 0:
        sdi = tl.load(sd + i * sd_n + h * sd_h)
        a = sdi
    else:
        sdi = tl.load(sd + i * sd_n + h * sd_h + cs, mask=cmask, other=0.)
        a = sdi
        if KIND == 1:
            a = tl.load(att + h * C + cs, mask=cmask, other=0.)
    for start in range(e0, e1, BLOCK_E):
        es = start + tl.arange(0, BLOCK_E)
        emask = es < e1
        j = tl.load(col + es, mask=emask, other=0).to(tl.int64)
        pre, logit = _score(ss, ss_n, ss_h, sdi, ed, ed_e, ed_h, a, j, es,
                            emask, cs, cmask, h, slope, KIND, HAS_EDGE)
        logit = tl.where(emask, logit, float('-inf'))
        m_new = tl.maximum(m, tl.max(logit, axis=0))
        scale = tl.where(m_new == float('-inf'), 0., tl.exp(m - m_new))
        w = tl.where(emask, tl.exp(logit - m_new), 0.)
        s = s * scale + tl.sum(w, axis=0)
        if HAS_MASK:
            w = w * tl.load(mask + es * H + h, mask=emask, other=0.)
        v = tl.load(val + j[:, None] * val_n + h * val_h + cs[None, :],
                    mask=emask[:, None] & cmask[None, :], other=0.)
        acc = acc * scale + tl.sum(w[:, None] * v, axis=0)
        m = m_new
    tl.store(mx + i * H + h, m)
    tl.store(sm + i * H + h, s)
    tl.store(out + i * out_n + h * out_h + cs, acc, mask=cmask)


@triton.jit
def _backward_rows(crow, col, ss, ss_n, ss_h, sd, sd_n, sd_h, ed, ed_e, ed_h,
                   att, val, val_n, val_h, mask, mx, sm, go, go_n, go_h,
                   delta, w_out, ds_out, gd, gd_n, gd_h, ge, ge_e, ge_h, ga,
                   H, C, slope, KIND: tl.constexpr, HAS_EDGE: tl.constexpr,
                   HAS_MASK: tl.constexpr, HAS_GE: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr):
    slope = tl.load(slope)
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    e0 = tl.load(crow + i).to(tl.int64)
    e1 = tl.load(crow + i + 1).to(tl.int64)
    cs = tl.arange(0, BLOCK_C)
    cmask = cs < C
    m = tl.load(mx + i * H + h)
    norm = tl.load(sm + i * H + h) + _EPS
    dl = tl.load(delta + i * H + h)
    g = tl.load(go + i * go_n + h * go_h + cs, mask=cmask, other=0.)
    if KIND == 0:
        sdi = tl.load(sd + i * sd_n + h * sd_h)
        a = sdi
        gd_acc = sdi * 0.
    else:
        sdi = tl.load(sd + i * sd_n + h * sd_h + cs, mask=cmask, other=0.)
        a = sdi
        if KIND == 1:
            a = tl.load(att + h * C + cs, mask=cmask, other=0.)
        gd_acc = sdi * 0.
    ga_acc = g * 0.
    for start in range(e0, e1, BLOCK_E):
        es = start + tl.arange(0, BLOCK_E)
        emask = es < e1
        j = tl.load(col + es, mask=emask, other=0).to(tl.int64)
        pre, logit = _score(ss, ss_n, ss_h, sdi, ed, ed_e, ed_h, a, j, es,
                            emask, cs, cmask, h, slope, KIND, HAS_EDGE)
        p = tl.where(emask, tl.exp(logit - m) / norm, 0.)
        if HAS_MASK:
            z = tl.load(mask + es * H + h, mask=emask, other=0.)
        else:
            z = tl.where(emask, 1., 0.)
        v = tl.load(val + j[:, None] * val_n + h * val_h + cs[None, :],
                    mask=emask[:, None] & cmask[None, :], other=0.)
        dot = tl.sum(v * g[None, :], axis=1)
        da = p * (z * dot - dl)
        tl.store(w_out + es * H + h, p * z, mask=emask)
        if KIND == 0:
            g0 = da * tl.where(pre > 0, 1., slope)
            tl.store(ds_out + es * H + h, g0, mask=emask)
            gd_acc += tl.sum(g0, axis=0)
        elif KIND == 2:
            # d a / d q_i = (k_j + e) / d, d a / d e = q_i / d.
            tl.store(ds_out + es * H + h, da, mask=emask)
            g1 = da / slope
            gd_acc += tl.sum(g1[:, None] * pre, axis=0)
            if HAS_GE:
                tl.store(ge + es[:, None] * ge_e + h * ge_h + cs[None, :],
                         g1[:, None] * sdi[None, :],
                         mask=emask[:, None] & cmask[None, :])
        else:
            tl.store(ds_out + es * H + h, da, mask=emask)
            dz = da[:, None] * a[None, :] * tl.where(pre > 0, 1., slope)
            gd_acc += tl.sum(dz, axis=0)
            if HAS_GE:
                tl.store(ge + es[:, None] * ge_e + h * ge_h + cs[None, :], dz,
                         mask=emask[:, None] & cmask[None, :])
            ga_acc += tl.sum(da[:, None] * tl.where(pre > 0, pre,
                                                    pre * slope), axis=0)
    if KIND == 0:
        ptr = gd + i * gd_n + h * gd_h
        tl.store(ptr, tl.load(ptr) + gd_acc)
    else:
        ptr = gd + i * gd_n + h * gd_h + cs
        tl.store(ptr, tl.load(ptr, mask=cmask, other=0.) + gd_acc,
                 mask=cmask)
        if KIND == 1:
            tl.atomic_add(ga + h * C + cs, ga_acc, mask=cmask)


@triton.jit
def _backward_cols(crow_t, col_t, perm, ss, ss_n, ss_h, sd, sd_n, sd_h, ed,
                   ed_e, ed_h, att, go, go_n, go_h, w, ds, gv, gv_n, gv_h, gs,
                   gs_n, gs_h, H, C, slope, KIND: tl.constexpr,
                   HAS_EDGE: tl.constexpr, HAS_GV: tl.constexpr,
                   HAS_GS: tl.constexpr, SAME: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr):
    slope = tl.load(slope)
    j = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    k0 = tl.load(crow_t + j).to(tl.int64)
    k1 = tl.load(crow_t + j + 1).to(tl.int64)
    cs = tl.arange(0, BLOCK_C)
    cmask = cs < C
    gv_acc = tl.zeros([BLOCK_C], dtype=w.dtype.element_ty)
    if KIND == 0:
        gs_acc = tl.sum(gv_acc, axis=0)
        ssj = gs_acc
        a = gs_acc
    else:
        gs_acc = gv_acc
        ssj = tl.load(ss + j * ss_n + h * ss_h + cs, mask=cmask, other=0.)
        a = ssj
        if KIND == 1:
            a = tl.load(att + h * C + cs, mask=cmask, other=0.)
    for start in range(k0, k1, BLOCK_E):
        ks = start + tl.arange(0, BLOCK_E)
        kmask = ks < k1
        i = tl.load(col_t + ks, mask=kmask, other=0).to(tl.int64)
        e = tl.load(perm + ks, mask=kmask, other=0).to(tl.int64)
        m2 = kmask[:, None] & cmask[None, :]
        if HAS_GV:
            g = tl.load(go + i[:, None] * go_n + h * go_h + cs[None, :],
                        mask=m2, other=0.)
            we = tl.load(w + e * H + h, mask=kmask, other=0.)
            gv_acc += tl.sum(we[:, None] * g, axis=0)
        if HAS_GS:
            dse = tl.load(ds + e * H + h, mask=kmask, other=0.)
            if KIND == 0:
                gs_acc += tl.sum(dse, axis=0)
            elif KIND == 2:
                q = tl.load(sd + i[:, None] * sd_n + h * sd_h + cs[None, :],
                            mask=m2, other=0.)
                gs_acc += tl.sum(dse[:, None] * q, axis=0) / slope
            else:
                pre = ssj[None, :] + tl.load(
                    sd + i[:, None] * sd_n + h * sd_h + cs[None, :], mask=m2,
                    other=0.)
                if HAS_EDGE:
                    pre += tl.load(ed + e[:, None] * ed_e + h * ed_h +
                                   cs[None, :], mask=m2, other=0.)
                gs_acc += tl.sum(dse[:, None] * a[None, :] *
                                 tl.where(pre > 0, 1., slope), axis=0)
    if SAME:
        gv_acc += gs_acc
    if HAS_GV:
        ptr = gv + j * gv_n + h * gv_h + cs
        tl.store(ptr, tl.load(ptr, mask=cmask, other=0.) + gv_acc,
                 mask=cmask)
    if HAS_GS and not SAME:
        if KIND == 0:
            ptr = gs + j * gs_n + h * gs_h
            tl.store(ptr, tl.load(ptr) + gs_acc)
        else:
            ptr = gs + j * gs_n + h * gs_h + cs
            tl.store(ptr, tl.load(ptr, mask=cmask, other=0.) + gs_acc,
                     mask=cmask)


def _scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    """A scalar in ``like``'s dtype (a Python float would be float32)."""
    return torch.full((1, ), value, dtype=like.dtype, device=like.device)


def _or(t: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``other`` as a stand-in pointer for an absent (empty) tensor."""
    return t if t.numel() else other


def forward(kind, crow, col, s_src, s_dst, edge, att, value, mask, run_max,
            run_sum, out, slope) -> None:
    rows, heads, channels = crow.numel() - 1, value.shape[1], value.shape[2]
    if rows <= 0:
        return
    block_e, block_c, warps = _blocks(kind, channels)
    _forward[(rows, heads)](
        crow, col, s_src, *_strides(s_src, 2), s_dst, *_strides(s_dst, 2),
        _or(edge, value), *_strides(edge, 2), _or(att, value), value,
        *_strides(value, 2), _or(mask, value), run_max, run_sum, out,
        *_strides(out, 2), heads, channels, _scalar(slope, value), KIND=kind,
        HAS_EDGE=edge.numel() > 0, HAS_MASK=mask.numel() > 0,
        BLOCK_E=block_e, BLOCK_C=block_c, num_warps=warps)


def backward_rows(kind, crow, col, s_src, s_dst, edge, att, value, mask,
                  run_max, run_sum, grad_out, delta, w, ds, grad_dst,
                  grad_edge, grad_att, slope) -> None:
    rows, heads, channels = crow.numel() - 1, value.shape[1], value.shape[2]
    if rows <= 0:
        return
    block_e, block_c, warps = _blocks(kind, channels)
    _backward_rows[(rows, heads)](
        crow, col, s_src, *_strides(s_src, 2), s_dst, *_strides(s_dst, 2),
        _or(edge, value), *_strides(edge, 2), _or(att, value), value,
        *_strides(value, 2), _or(mask, value), run_max, run_sum, grad_out,
        *_strides(grad_out, 2), delta, w, ds, grad_dst,
        *_strides(grad_dst, 2), _or(grad_edge, value),
        *_strides(grad_edge, 2), _or(grad_att, value), heads, channels,
        _scalar(slope, value), KIND=kind, HAS_EDGE=edge.numel() > 0,
        HAS_MASK=mask.numel() > 0, HAS_GE=grad_edge.numel() > 0,
        BLOCK_E=block_e, BLOCK_C=block_c, num_warps=warps)


def backward_cols(kind, crow_t, col_t, perm, s_src, s_dst, edge, att,
                  grad_out, w, ds, grad_value, grad_src, slope) -> None:
    sources, heads = crow_t.numel() - 1, w.shape[1]
    channels = grad_out.shape[2]
    if sources <= 0:
        return
    has_gv, has_gs = grad_value.numel() > 0, grad_src.numel() > 0
    same = has_gv and has_gs and grad_value.data_ptr() == \
        grad_src.data_ptr() and grad_value.shape == grad_src.shape
    block_e, block_c, warps = _blocks(kind, channels)
    _backward_cols[(sources, heads)](
        crow_t, col_t, perm, s_src, *_strides(s_src, 2), s_dst,
        *_strides(s_dst, 2), _or(edge, w), *_strides(edge, 2), _or(att, w),
        grad_out, *_strides(grad_out, 2), w, ds, _or(grad_value, w),
        *_strides(grad_value, 2), _or(grad_src, w), *_strides(grad_src, 2),
        heads, channels, _scalar(slope, w), KIND=kind,
        HAS_EDGE=edge.numel() > 0,
        HAS_GV=has_gv, HAS_GS=has_gs, SAME=same, BLOCK_E=block_e,
        BLOCK_C=block_c, num_warps=warps)
