"""``torch.nn.SyncBatchNorm``'s algorithm on the CPU: the peer ``sync_bn.py`` times
``GCUSyncBatchNorm`` against.

torch's own layer cannot run here: its forward refuses a CPU input ("SyncBatchNorm expected
input tensor to be on GPU or XPU or privateuseone") and its five kernels
(``batch_norm_stats``, ``batch_norm_gather_stats_with_counts``, ``batch_norm_elemt``,
``batch_norm_backward_reduce``, ``batch_norm_backward_elemt``) have no CPU implementation.
:class:`TorchAlgorithmSyncBN` is ``torch.nn.modules._functions.SyncBatchNorm`` of torch
2.13 step by step, with the same collectives on the same gloo group (forward: one
``all_gather`` of each rank's ``[mean, invstd, count]``, ``2C + 1`` floats; backward: one
``all_reduce`` of ``[sum_dy, sum_dy_xmu]``, ``2C``), and each kernel written as the fewest
CPU tensor ops that compute it. The empty-rank mask (a host sync on a card) is kept.
"""

import torch
import torch.distributed as dist


def _dims(x):
    return [0] + list(range(2, x.dim()))


def _c(t, x):
    return t.view([1, -1] + [1] * (x.dim() - 2))


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, world_size):
        channels = x.shape[1]
        var, mean = torch.var_mean(x, _dims(x), unbiased=False)  # batch_norm_stats
        invstd = torch.rsqrt(var + eps)
        count = torch.full((1,), x.numel() // channels, dtype=mean.dtype)
        combined = torch.cat([mean, invstd, count])
        gathered = [torch.empty_like(combined) for _ in range(world_size)]
        dist.all_gather(gathered, combined)
        mean_all, invstd_all, count_all = torch.stack(gathered).split(channels, dim=1)
        mask = count_all.squeeze(-1) >= 1
        mean_all, invstd_all, counts = mean_all[mask], invstd_all[mask], count_all[mask]
        # batch_norm_gather_stats_with_counts: the group's mean and biased variance
        total = counts.sum()
        mean = (mean_all * counts).sum(0) / total
        var_all = invstd_all.pow(-2) - eps
        var = ((var_all + (mean_all - mean).pow(2)) * counts).sum(0) / total
        invstd = torch.rsqrt(var + eps)
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
            running_var.mul_(1 - momentum).add_(var * total / (total - 1), alpha=momentum)
        ctx.save_for_backward(x, weight, mean, invstd, total)
        # batch_norm_elemt
        scale = invstd * weight
        return torch.addcmul(_c(bias - mean * scale, x), x, _c(scale, x))

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd, total = ctx.saved_tensors
        channels = x.shape[1]
        dims = _dims(x)
        xmu = x - _c(mean, x)
        # batch_norm_backward_reduce
        sum_dy = dy.sum(dims)
        sum_dy_xmu = (dy * xmu).sum(dims)
        grad_weight = sum_dy_xmu * invstd
        grad_bias = sum_dy
        combined = torch.cat([sum_dy, sum_dy_xmu])
        dist.all_reduce(combined)
        sum_dy, sum_dy_xmu = combined.split(channels)
        # batch_norm_backward_elemt
        mean_dy = sum_dy / total
        factor = sum_dy_xmu / total * invstd * invstd
        grad_x = (dy - _c(mean_dy, x) - xmu * _c(factor, x)) * _c(invstd * weight, x)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


class TorchAlgorithmSyncBN(torch.nn.BatchNorm2d):
    """A ``BatchNorm2d`` whose training forward is torch's SyncBatchNorm algorithm over the
    default group (affine, running statistics tracked, a momentum)."""

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        self.num_batches_tracked.add_(1)
        return _Function.apply(
            x, self.weight, self.bias, self.running_mean, self.running_var, self.eps,
            self.momentum, dist.get_world_size(),
        )  # fmt: skip
