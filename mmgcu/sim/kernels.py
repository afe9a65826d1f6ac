"""Card kernels that PyTorch's CPU build lacks, written with ordinary ops.

torch_gcu 2.x provides SyncBatchNorm's kernels for ``gcu`` tensors; the CPU build of
PyTorch has them only for CUDA, so the CPU fallback cannot run them. These compute the
same statistics on the card, so SyncBN really exchanges them over the (simulated) ECCL.
"""

import torch


def _dims(x):
    return [0] + list(range(2, x.dim()))


def _channel(t, x):
    return t.view([1, -1] + [1] * (x.dim() - 2))


def batch_norm_stats(x, eps):
    xf = x.float()
    mean = xf.mean(_dims(x))
    var = xf.var(_dims(x), unbiased=False)
    return mean, torch.rsqrt(var + eps)


def batch_norm_gather_stats_with_counts(
    x, mean_all, invstd_all, running_mean, running_var, momentum, eps, counts
):
    counts = counts.to(mean_all.dtype).view(-1, 1)
    total = counts.sum()
    mean = (mean_all * counts).sum(0) / total
    var_all = invstd_all.pow(-2) - eps
    var = ((var_all + (mean_all - mean).pow(2)) * counts).sum(0) / total
    if running_mean is not None:
        running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
    if running_var is not None:
        unbiased = var * total / (total - 1).clamp(min=1)
        running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
    return mean, torch.rsqrt(var + eps)


def batch_norm_elemt(x, weight, bias, mean, invstd, eps):
    out = (x.float() - _channel(mean, x)) * _channel(invstd, x)
    if weight is not None:
        out = out * _channel(weight.float(), x)
    if bias is not None:
        out = out + _channel(bias.float(), x)
    return out.to(x.dtype)


def batch_norm_backward_reduce(dy, x, mean, invstd, weight, input_g, weight_g, bias_g):
    dyf = dy.float()
    xmu = x.float() - _channel(mean, x)
    sum_dy = dyf.sum(_dims(x))
    sum_dy_xmu = (dyf * xmu).sum(_dims(x))
    grad_weight = sum_dy_xmu * invstd if weight_g else x.new_empty(0)
    grad_bias = sum_dy if bias_g else x.new_empty(0)
    if weight is not None:
        grad_weight = grad_weight.to(weight.dtype)
        grad_bias = grad_bias.to(weight.dtype)
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


def batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    total = count.sum().to(torch.float32)
    xmu = x.float() - _channel(mean, x)
    inv = _channel(invstd, x)
    grad = (
        dy.float()
        - _channel(sum_dy / total, x)
        - xmu * inv.pow(2) * _channel(sum_dy_xmu / total, x)
    )
    grad = grad * inv
    if weight is not None:
        grad = grad * _channel(weight.float(), x)
    return grad.to(x.dtype)


_KERNELS = {
    "batch_norm_stats": batch_norm_stats,
    "batch_norm_gather_stats_with_counts": batch_norm_gather_stats_with_counts,
    "batch_norm_elemt": batch_norm_elemt,
    "batch_norm_backward_reduce": batch_norm_backward_reduce,
    "batch_norm_backward_elemt": batch_norm_backward_elemt,
}
_LIBRARIES = []


def register(dispatch_key: str) -> None:
    """Register these kernels for one device's dispatch key ('PrivateUse1' or 'XLA')."""
    lib = torch.library.Library("aten", "IMPL")
    for name, fn in _KERNELS.items():
        lib.impl(name, fn, dispatch_key)
    _LIBRARIES.append(lib)  # a Library unregisters its kernels when collected
