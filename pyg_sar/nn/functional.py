"""Layer helpers that keep less for backward, or hold fewer node-sized
temporaries, than their stock composition.

:func:`add_linear_` adds a linear map of ``x`` into a fresh output in one
product (``addmm_``): ``out + lin(x)`` first materializes ``lin(x)`` next to
``out`` and their sum, three node-sized tensors at once; the fused product
holds one.

``F.dropout(F.relu(x))`` keeps three node-sized tensors alive until
backward: the ReLU output (for ReLU's gradient), the float dropout noise
(for the product's gradient) and the dropout output (the next layer's
input, kept by its linear map). :func:`relu_dropout` computes the same
function, ``relu(x) * keep / (1 - p)``, but keeps only its output: the
gradient is ``grad / (1 - p)`` where the output is positive and zero
elsewhere, which is what the stock pair computes for the same mask: two node-sized
tensors fewer per layer held through the whole forward. Its keep mask is
``uniform_() >= p`` rather than ATen's CPU ``bernoulli_(1 - p)`` (the same
distribution, several times faster on the CPU), so it does not replay
``F.dropout``'s random numbers.

:func:`linear_of_aggregate` computes ``lin(aggregate())`` without keeping
the aggregate for the weight's gradient when it can be recomputed (its input
needs no gradient, as the features entering a first layer): the aggregation
runs once more in backward instead (one node-sized tensor less per layer).
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parameter import UninitializedParameter
from torch_geometric.nn.dense.linear import Linear as PyGLinear

# Linear modules whose forward is exactly x @ W^T + b (a subclass that
# overrides forward goes through its own forward).
_PLAIN_FORWARDS = (PyGLinear.forward, torch.nn.Linear.forward)


def add_linear_(out: Tensor, x: Tensor, lin) -> Tensor:
    """``out += lin(x)`` in place for a PyG or torch ``Linear`` ``lin``, in
    one ``addmm_`` where ``out`` and ``x`` are matrices and ``lin`` is
    initialized (else ``out + lin(x)``). ``out`` must be a fresh result of
    the caller's (autograd refuses the in-place add at backward if anything
    saved it)."""
    weight = getattr(lin, 'weight', None)
    if (out.dim() == 2 and x.dim() == 2 and isinstance(weight, Tensor)
            and not isinstance(weight, UninitializedParameter)
            and type(lin).forward in _PLAIN_FORWARDS
            and out.dtype == x.dtype == weight.dtype):
        out = out.addmm_(x, weight.t())
        return out if lin.bias is None else out.add_(lin.bias)
    return out + lin(x)


def linear_of_aggregate(lin, aggregate: Callable[[], Tensor],
                        inputs: Tuple[Optional[Tensor], ...] = ()) -> Tensor:
    """``lin(aggregate())``, without keeping the aggregate for backward
    where it can be recomputed instead: when the aggregate needs no gradient
    (its input needs none, e.g. the input features of a first layer), the
    copy ``lin``'s weight gradient would save is dropped
    (``torch.autograd.graph.saved_tensors_hooks``) and :obj:`aggregate` is
    called again, without gradients, when backward needs it: one node-sized
    tensor less between forward and backward for one more aggregation (SAR's
    rematerialization). The gradients are those of ``lin(aggregate())``.

    :obj:`aggregate` must give the same result when called again (the same
    graph and input; a distributed aggregation runs its exchange again, on
    every rank at the same point of backward, as the engine's own backward
    does). :obj:`inputs` are the tensors :obj:`aggregate` reads: one
    changed in place between forward and backward would change the
    recomputed aggregate, so backward then raises, as autograd does for a
    saved tensor."""
    agg = aggregate()
    if agg.requires_grad or not torch.is_grad_enabled() or agg.dim() == 0:
        return lin(agg)
    key = (agg.data_ptr(), agg.shape, agg.stride(), agg.dtype)
    inputs = [t for t in inputs if isinstance(t, Tensor)]
    versions = [t._version for t in inputs]

    def pack(t: Tensor):
        if (t.data_ptr(), t.shape, t.stride(), t.dtype) == key:
            return _Recompute
        return t

    def unpack(saved):
        if saved is _Recompute:
            if [t._version for t in inputs] != versions:
                raise RuntimeError(
                    "An input of an aggregation was modified in place "
                    "after the forward pass; its aggregate, recomputed for "
                    "backward, would differ (pass a copy, or modify it "
                    "after backward)")
            with torch.no_grad():
                return aggregate()
        return saved

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = lin(agg)
    return out


class _Recompute:
    """Marker of a saved tensor that :func:`linear_of_aggregate`
    recomputes at backward."""


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
