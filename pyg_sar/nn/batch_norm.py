import torch
from torch import Tensor

from pyg_sar import comm


class _GlobalBatchNorm(torch.autograd.Function):
    """Batch normalization with statistics summed over every rank."""

    @staticmethod
    def forward(ctx, x: Tensor, weight, bias, eps: float):
        stats = torch.cat([x.sum(0), (x * x).sum(0),
                           x.new_tensor([float(x.shape[0])])])
        comm.all_reduce(stats, 'sum')
        num_features = x.shape[1]
        count = stats[-1]
        mean = stats[:num_features] / count
        var = (stats[num_features:2 * num_features] / count - mean * mean
               ).clamp(min=0)
        inv_std = torch.rsqrt(var + eps)
        x_hat = (x - mean) * inv_std
        ctx.save_for_backward(x_hat, inv_std, weight)
        ctx.count = count
        ctx.has_affine = weight is not None
        out = x_hat * weight + bias if weight is not None else x_hat
        ctx.mark_non_differentiable(mean, var, count)
        return out, mean, var, count

    @staticmethod
    def backward(ctx, grad_out: Tensor, *_unused):
        x_hat, inv_std, weight = ctx.saved_tensors
        # Both sums run over all nodes of all ranks.
        sums = torch.cat([grad_out.sum(0), (grad_out * x_hat).sum(0)])
        comm.all_reduce(sums, 'sum')
        num_features = x_hat.shape[1]
        grad_bias, grad_weight = sums[:num_features], sums[num_features:]
        scale = inv_std * (weight if weight is not None else 1.0)
        grad_x = scale / ctx.count * (ctx.count * grad_out - grad_bias -
                                      x_hat * grad_weight)
        if not ctx.has_affine:
            return grad_x, None, None, None
        # Parameter gradients stay per rank (partial sums), like every other
        # parameter; all_reduce_grads sums them.
        return (grad_x, (grad_out * x_hat).sum(0), grad_out.sum(0), None)


class BatchNorm(torch.nn.Module):
    r"""Batch normalization over all nodes of all workers.

    .. math::
        \mathbf{x}^{\prime}_i = \frac{\mathbf{x} -
        \textrm{E}[\mathbf{x}]}{\sqrt{\textrm{Var}[\mathbf{x}] + \epsilon}}
        \odot \gamma + \beta

    The mean and variance are those of the whole graph (sums all-reduced
    over ranks), so a distributed model normalizes exactly as
    :class:`torch_geometric.nn.BatchNorm` does on one machine. Same
    constructor and ``state_dict`` (``module.weight``, ``module.bias``,
    ``module.running_mean``, ...) as PyG's.
    """

    def __init__(self, in_channels: int, eps: float = 1e-5,
                 momentum: float = 0.1, affine: bool = True,
                 track_running_stats: bool = True,
                 allow_single_element: bool = False) -> None:
        super().__init__()
        if allow_single_element and not track_running_stats:
            raise ValueError("'allow_single_element' requires "
                             "'track_running_stats' to be set to `True`")
        self.module = torch.nn.BatchNorm1d(in_channels, eps, momentum, affine,
                                           track_running_stats)
        self.in_channels = in_channels
        self.allow_single_element = allow_single_element

    def reset_running_stats(self) -> None:
        self.module.reset_running_stats()

    def reset_parameters(self) -> None:
        self.module.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        bn = self.module
        if not (self.training or not bn.track_running_stats):
            return torch.nn.functional.batch_norm(
                x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False,
                0.0, bn.eps)
        out, mean, var, count = _GlobalBatchNorm.apply(x, bn.weight, bn.bias,
                                                       bn.eps)
        if self.training and bn.track_running_stats:
            with torch.no_grad():
                bn.num_batches_tracked += 1
                momentum = (bn.momentum if bn.momentum is not None else
                            1.0 / float(bn.num_batches_tracked))
                unbiased = var * count / (count - 1).clamp(min=1)
                bn.running_mean.mul_(1 - momentum).add_(momentum * mean)
                bn.running_var.mul_(1 - momentum).add_(momentum * unbiased)
        return out

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({self.module.extra_repr()})'
