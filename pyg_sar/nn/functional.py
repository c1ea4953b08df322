"""Functions the layers share where PyG's idiom costs more than it needs.

``head_scores``: GAT's per-head scores ``(h * att).sum(-1)`` as one matrix
product over ``h`` for all the ``att`` vectors at once: no ``[N, H, C]``
products in forward or backward (the idiom makes one per vector each way,
and a second pass to sum it).

``relu_dropout``: ``F.dropout(F.relu(x))`` keeping less for backward.

``F.dropout(F.relu(x))`` keeps three node-sized tensors alive until
backward: the ReLU output (for ReLU's gradient), the float dropout noise
(for the product's gradient) and the dropout output (the next layer's
input, kept by its linear map). :func:`relu_dropout` computes the same
function, ``relu(x) * keep / (1 - p)``, but keeps only its output: the
gradient is ``grad / (1 - p)`` where the output is positive and zero
elsewhere, which is what the stock pair computes for the same mask: two
node-sized tensors fewer per layer held through the whole forward. Its keep
mask is ``uniform_() >= p`` rather than ATen's CPU ``bernoulli_(1 - p)``
(the same distribution, several times faster on the CPU), so it does not
replay ``F.dropout``'s random numbers.
"""
from __future__ import annotations

import contextlib
from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


def _autocast_off(device_type: str):
    """A context with autocast off for ``device_type`` (nothing to turn off
    where autocast does not know the device, e.g. ``meta``)."""
    try:
        return torch.autocast(device_type, enabled=False)
    except RuntimeError:
        return contextlib.nullcontext()


def head_scores(h: Tensor, *atts: Tensor) -> List[Tensor]:
    """``[(h * att).sum(-1) for att in atts]`` for ``h`` of shape ``[N, H,
    C]`` and each ``att`` of ``H * C`` elements (``[1, H, C]``), computed as
    ``h.view(N, H * C) @ A`` with ``A`` the attention vectors laid out block
    diagonally (``[H * C, H]`` per vector, side by side): one pass over
    ``h``, and its gradient one product back. The same numbers up to the
    order of the additions over ``C``."""
    num, heads, channels = h.shape
    # In the dtype the idiom's product promotes to (under autocast too: an
    # elementwise product is not cast down, so neither is this one).
    dtype = h.dtype
    for att in atts:
        dtype = torch.promote_types(dtype, att.dtype)
    with _autocast_off(h.device.type):
        eye = torch.eye(heads, dtype=dtype, device=h.device)
        blocks = [(att.to(dtype).reshape(heads, channels, 1) *
                   eye.view(heads, 1, heads)).reshape(heads * channels, heads)
                  for att in atts]
        out = _RowsTimes.apply(h.reshape(num, heads * channels).to(dtype),
                               torch.cat(blocks, dim=1))
    return [part.contiguous() for part in out.split(heads, dim=1)]


class _RowsTimes(torch.autograd.Function):
    """``x @ a`` for a tall ``x`` and a narrow ``a``, whose backward forms
    ``a``'s gradient as ``(g^T x)^T``: the layout BLAS reduces over the rows
    of ``x`` fastest (``x^T g`` was 7x slower at 200k x 128 by 8)."""

    @staticmethod
    def forward(ctx, x: Tensor, a: Tensor) -> Tensor:
        ctx.save_for_backward(x, a)
        return x @ a

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, a = ctx.saved_tensors
        grad_x = grad @ a.t() if ctx.needs_input_grad[0] else None
        grad_a = (grad.t() @ x).t() if ctx.needs_input_grad[1] else None
        return grad_x, grad_a


def _relu_dropout(x: Tensor, p: float) -> Tuple[Tensor, Tensor]:
    """``relu(x) * noise`` and the scale ``1 / (1 - p)``, where ``noise`` is
    the scale with probability ``1 - p`` and 0 otherwise (one node-sized
    temporary besides ``x``: the noise's buffer becomes the output)."""
    scale = torch.ones((), dtype=x.dtype, device=x.device).div_(1 - p)
    noise = torch.empty_like(x).uniform_().ge_(p).mul_(scale)
    # relu(x) * n == relu(x * n) for the noise n >= 0.
    return noise.mul_(x).clamp_min_(0), scale


class _ReLUDropout(torch.autograd.Function):
    """``relu(x) * noise`` (:func:`_relu_dropout`); saves only the
    output."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        out, scale = _relu_dropout(x, p)
        ctx.save_for_backward(out, scale)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        out, scale = ctx.saved_tensors
        # out > 0 exactly where x > 0 and the unit was kept: ReLU's own
        # backward kernel against the output (one node-sized result, no
        # byte mask), then the dropout scale in place.
        return torch.ops.aten.threshold_backward(grad, out, 0).mul_(scale), \
            None


def relu_dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """``F.dropout(F.relu(x), p, training)``: the same function and, for
    the same keep mask, the same gradients, keeping only the output for
    backward instead of the ReLU output, the dropout noise and the output.
    The mask is drawn as ``uniform_() >= p`` (module docs); on a GPU, and
    for ``p`` of 1, it is the stock pair."""
    if not training or p <= 0.0:
        return F.relu(x)
    if p >= 1.0 or x.device.type != 'cpu':
        return F.dropout(F.relu(x), p=p, training=training)
    if not (x.requires_grad and torch.is_grad_enabled()):
        return _relu_dropout(x, p)[0]
    return _ReLUDropout.apply(x, p)
