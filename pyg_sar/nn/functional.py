"""Activation helpers that keep less for backward than their stock
composition.

``F.dropout(F.relu(x))`` keeps three node-sized tensors alive until
backward: the ReLU output (for ReLU's gradient), the float dropout noise
(for the product's gradient) and the dropout output (the next layer's
input, kept by its linear map). :func:`relu_dropout` returns the same values
from the same random numbers but keeps only its output: the gradient is
``grad * scale`` where the output is positive and zero elsewhere, which is
exactly what the stock pair computes. On a 200k x 256 float32 hidden layer
that is 390 MiB less per layer held through the whole forward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


class _ReLUDropout(torch.autograd.Function):
    """``relu(x) * noise`` with ``noise`` drawn as CPU ``F.dropout`` draws
    it; saves only the output."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        # The draw of ATen's CPU dropout: empty_like(x).bernoulli_(1 - p),
        # then divided in place by 1 - p; same generator calls, same values.
        noise = torch.empty_like(x).bernoulli_(1 - p)
        noise.div_(1 - p)
        out = x.clamp_min(0).mul_(noise)
        scale = torch.ones((), dtype=x.dtype, device=x.device).div_(1 - p)
        del noise
        ctx.save_for_backward(out, scale)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        out, scale = ctx.saved_tensors
        # out > 0 exactly where x > 0 and the unit was kept.
        # One node-sized temporary (plus a byte mask), as threshold_backward.
        return (grad * scale).masked_fill_(out <= 0, 0), None


def relu_dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """``F.dropout(F.relu(x), p, training)`` with the same outputs and
    gradients (and, on the CPU, the same random numbers), keeping only the
    output for backward instead of the ReLU output, the dropout noise and
    the output. Falls back to the stock pair where that equality is not
    guaranteed (a GPU, whose dropout kernel draws differently; ``p`` of 0
    or 1; no gradient needed)."""
    if not training or p <= 0.0:
        return F.relu(x)
    if p >= 1.0 or x.device.type != 'cpu' or not x.requires_grad or \
            not torch.is_grad_enabled():
        return F.dropout(F.relu(x), p=p, training=training)
    return _ReLUDropout.apply(x, p)
