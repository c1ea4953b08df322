"""Whole-graph statistics of node rows split across ranks.

Every function here is a collective (it calls :func:`pyg_sar.comm.global_sum`
once): all ranks must call it in the same order, with the same trailing
shape and dtype, even a rank that holds no rows. Gradients flow through the
all-reduce, so autograd gives the exact whole-graph backward.
"""
from typing import Tuple

import torch
from torch import Tensor

from pyg_sar.comm import global_sum

DIST_BATCH_ERROR = (
    "{name}: a per-graph 'batch' vector is not supported over a distributed "
    "graph (one graph spans all workers); pass batch=None to normalize over "
    "the whole graph")


def global_mean(x: Tensor) -> Tuple[Tensor, int]:
    r"""Column means :math:`\frac{1}{N} \sum_i \mathbf{x}_i` over the rows of
    all ranks, and the global row count :math:`N`.

    Sums are accumulated in at least float32 (and the count travels in the
    same message); the mean is returned in ``x``'s dtype.
    """
    from pyg_sar.graph.mfg import active
    if active() is not None:
        raise ValueError("a norm over all nodes (its statistics mix every "
                         "row) is not exact with layer-wise MFGs, which "
                         "compute only the rows the seeds need; run the "
                         "model without layer_wise")
    acc = torch.promote_types(x.dtype, torch.float32)
    local = torch.cat([x.sum(0, dtype=acc).reshape(-1),
                       torch.full((1, ), x.size(0), dtype=acc,
                                  device=x.device)])
    total = global_sum(local)
    count = int(round(float(total[-1].detach())))
    mean = total[:-1] / total[-1]
    return mean.view(x.shape[1:]).to(x.dtype), count


def global_moments(x: Tensor) -> Tuple[Tensor, Tensor, int]:
    r"""Column mean and biased variance over the rows of all ranks, computed
    in two passes (mean first, then the mean of squared deviations), which
    stays accurate when the features carry a large common offset.

    Returns:
        ``(mean, var, N)`` with :math:`\mathrm{Var} = \frac{1}{N} \sum_i
        (\mathbf{x}_i - \mathrm{E}[\mathbf{x}])^2`.
    """
    mean, count = global_mean(x)
    var, _ = global_mean((x - mean).pow(2))
    return mean, var, count


def update_running_stats(running_mean: Tensor, running_var: Tensor,
                         mean: Tensor, var: Tensor, count: int,
                         momentum: float) -> None:
    r"""In place: :math:`r \leftarrow (1 - m) r + m s` for the mean and the
    unbiased variance :math:`\frac{N}{N - 1} \mathrm{Var}`, like
    :func:`torch.nn.functional.batch_norm`."""
    with torch.no_grad():
        unbiased = var * (count / max(count - 1, 1))
        running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
        running_var.mul_(1 - momentum).add_(unbiased.detach(),
                                            alpha=momentum)


def normalize(x: Tensor, mean: Tensor, var: Tensor, eps: float,
              weight, bias) -> Tensor:
    r""":math:`(x - \mu) / \sqrt{\sigma^2 + \epsilon} \cdot \gamma +
    \beta`, the affine parts skipped where they are :obj:`None`."""
    out = (x - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out
