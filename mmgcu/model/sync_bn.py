"""``GCUSyncBatchNorm``: SyncBN made of ordinary tensor ops and one all-reduce per pass.

torch's ``nn.SyncBatchNorm`` needs the kernels ``batch_norm_stats``,
``batch_norm_gather_stats_with_counts``, ``batch_norm_elemt``, ``batch_norm_backward_reduce``
and ``batch_norm_backward_elemt``, which no GCU generation has (torch_gcu 1.x has no SyncBN
kernel; torch_gcu 2.x lists ``native_batch_norm`` but none of these). This layer computes the
same thing with sums, products, ``rsqrt`` and the card group's ``all_reduce``, so it runs
wherever a card can add and all-reduce.

The card group (``GCUSyncBatchNorm.card_group``) is any object with

- ``world_size``: the number of ranks in the group (an ``int``), and
- ``all_reduce(tensor)``: sums ``tensor`` over the group, in place, on every rank.

mmgcu's runner sets it on every layer (:func:`convert_gcu_sync_batchnorm`) before DDP wraps
the model: the accelerator's :class:`~mmgcu.device.CardGroup`, over torch_gcu.distributed's
ECCL group on torch_gcu 1.x and over torch.distributed on 2.x and the CPU. With no group,
a group of one rank, or in eval mode the layer is plain BatchNorm.

Training with a group of two or more ranks, per channel ``c``, with ``K`` a shift equal on
every rank (the running mean when it is tracked, else 0) and ``n`` the local count
``N * H * W ...``, known on the host from the input's shape:

- forward: one all-reduce of ``[sum(x - K), sum((x - K)^2), n]`` in float32, packed in one
  tensor of ``2C + 1`` values. From the totals ``S1, S2, N``: ``mean = K + S1/N``,
  ``var = max(S2/N - (S1/N)^2, 0)`` (biased), ``y = (x - mean) * rsqrt(var + eps) * w + b``.
  Running stats: ``r <- (1 - m) r + m * stat`` with the unbiased ``var * N / (N - 1)``, ``m``
  the momentum or ``1 / num_batches_tracked`` (cumulative) when it is None.
- backward: one all-reduce of ``[sum(dy), sum(dy * xhat)]`` (``xhat = (x - mean) * invstd``).
  The gradient of the loss with respect to the packed statistics ``(S1, S2)`` is, per
  channel, a linear function of these two sums with the same coefficients on every rank, so
  this is the all-reduce of that gradient; then
  ``dx = w * invstd * (dy - sum_all(dy)/N - xhat * sum_all(dy * xhat)/N)``. ``dw``/``db`` are
  this rank's ``sum(dy * xhat)``/``sum(dy)``: DDP averages them, as with torch's SyncBN. No
  all-reduce when the input needs no gradient (only ``dw``/``db`` are wanted then).

Why shifted sums: ``E[x^2] - E[x]^2`` in float32 loses ``eps_f32 * mean^2 / var`` of the
variance to cancellation; around ``K`` the loss is ``eps_f32 * (mean - K)^2 / var``, and the
running mean is close to the batch mean once training has started (or a checkpoint was
loaded). An exact combination (Chan's) needs each rank's mean, an all-gather, not a sum.

No host reads: counts come from shapes, the cumulative factor and the empty-batch guard are
tensor ops, and a rank whose batch is empty still takes part in both all-reduces (its sums
are zeros). A total count of 1 (BN raises there) gives a running variance update of 0 * N
instead of a division by zero. Only ``num_batches_tracked`` and the running stats are written
in place, as BN does.
"""

import copy
import sys
from typing import Optional

import torch
from mmengine.registry import MODELS
from torch.nn.modules.batchnorm import _BatchNorm

from ..compat.mmengine import BatchNormXd

__all__ = [
    "GCUSyncBatchNorm",
    "convert_gcu_sync_batchnorm",
    "revert_gcu_sync_batchnorm",
]


def _reduce_dims(x: torch.Tensor):
    return [0] + list(range(2, x.dim()))


def _per_channel(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return t.view([1, -1] + [1] * (x.dim() - 2))


def _global_moments(centred, x, group):
    """One all-reduce of ``[sum(x - K), sum((x - K)^2), n]``: the group's count, the mean
    of ``x - K`` and the biased variance (per channel)."""
    channels = x.shape[1]
    count = x.numel() // channels if channels else 0  # from the shape: no host read
    dims = _reduce_dims(x)
    stats = torch.cat(
        [centred.sum(dims), (centred * centred).sum(dims), centred.new_full((1,), float(count))]
    )
    group.all_reduce(stats)
    total = stats[2 * channels :]
    seen = total.clamp(min=1)
    shifted_mean = stats[:channels] / seen
    var = (stats[channels : 2 * channels] / seen - shifted_mean * shifted_mean).clamp(min=0)
    return total, shifted_mean, var


def _update_running(running_mean, running_var, num_batches_tracked, momentum, mean, var, total):
    """BN's running statistics from the group's moments (unbiased variance), in place."""
    if running_mean is None and running_var is None:
        return
    if momentum is None:
        factor = 1.0 / num_batches_tracked.float()  # cumulative average
    else:
        factor = torch.full_like(total, momentum)
    factor = factor * (total > 0).float()  # an all-empty step changes nothing
    if running_mean is not None:
        running_mean.copy_(running_mean.float() * (1 - factor) + mean * factor)
    if running_var is not None:
        unbiased = var * total / (total - 1).clamp(min=1)
        running_var.copy_(running_var.float() * (1 - factor) + unbiased * factor)


class _SyncBatchNormFunction(torch.autograd.Function):
    """Batch norm over the union of the group's batches; see the module docstring."""

    @staticmethod
    def forward(
        ctx,
        x,
        weight,
        bias,
        running_mean,
        running_var,
        num_batches_tracked,
        momentum,
        eps,
        group,
    ):
        channels = x.shape[1]
        xf = x.float()
        shift = running_mean.detach().float() if running_mean is not None else None
        if shift is None:
            shift = xf.new_zeros(channels)
        centred = xf - _per_channel(shift, x)  # a new tensor: normalised in place below
        total, shifted_mean, var = _global_moments(centred, x, group)
        invstd = torch.rsqrt(var + eps)
        mean = shift + shifted_mean
        _update_running(running_mean, running_var, num_batches_tracked, momentum, mean, var, total)
        scale = invstd if weight is None else invstd * weight.float()
        y = centred.sub_(_per_channel(shifted_mean, x)).mul_(_per_channel(scale, x))
        if bias is not None:
            y.add_(_per_channel(bias.float(), x))
        ctx.save_for_backward(x, weight, mean, invstd, total.clamp(min=1))
        ctx.group = group
        ctx.has_bias = bias is not None
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, mean, invstd, seen = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        channels = x.shape[1]
        dims = _reduce_dims(x)
        dy = grad_out.float()
        xhat = (x.float() - _per_channel(mean, x)).mul_(_per_channel(invstd, x))
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        grad_x = grad_w = grad_b = None
        if need_w and weight is not None:
            grad_w = sum_dy_xhat.to(weight.dtype)
        if need_b and ctx.has_bias:
            grad_b = sum_dy.to(ctx.bias_dtype)
        if need_x:
            sums = torch.cat([sum_dy, sum_dy_xhat])
            ctx.group.all_reduce(sums)
            mean_dy = sums[:channels] / seen
            mean_dy_xhat = sums[channels:] / seen
            scale = invstd if weight is None else invstd * weight.float()
            # (xhat * mean_dy_xhat + mean_dy - dy) * -scale, in place in xhat's buffer
            grad_x = (
                xhat.mul_(_per_channel(mean_dy_xhat, x))
                .add_(_per_channel(mean_dy, x))
                .sub_(dy)
                .mul_(_per_channel(-scale, x))
                .to(x.dtype)
            )
        return grad_x, grad_w, grad_b, None, None, None, None, None, None


@MODELS.register_module("GCUSyncBN")
class GCUSyncBatchNorm(_BatchNorm):
    """SyncBatchNorm over an injected card group, from ordinary ops (see the module docs).

    A :class:`torch.nn.modules.batchnorm._BatchNorm`: same arguments, parameters, buffers and
    state-dict keys as ``BatchNorm2d`` and ``SyncBatchNorm``, any input of 2 or more
    dimensions ``(N, C, ...)``. Build it with ``norm_cfg=dict(type='GCUSyncBN')`` (mmcv names
    it ``bn``, like BN and SyncBN), or convert a model's SyncBN layers with
    :func:`convert_gcu_sync_batchnorm`.

    Attributes:
        card_group: an object with ``world_size`` and an in-place summing ``all_reduce``
            (None: plain BatchNorm). Shared, not copied, by ``copy.deepcopy``; not pickled.
    """

    _abbr_ = "bn"

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device=None,
        dtype=None,
        card_group=None,
    ):
        super().__init__(
            num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype
        )
        self.card_group = card_group

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        group = self.card_group
        if not self.training or group is None or group.world_size <= 1:
            return super().forward(input)
        self._check_input_dim(input)
        tracked = self.track_running_stats
        if tracked and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        momentum = self.momentum
        if momentum is None and (not tracked or self.num_batches_tracked is None):
            momentum = 0.0  # what BN does
        return _SyncBatchNormFunction.apply(
            input,
            self.weight,
            self.bias,
            self.running_mean if tracked else None,
            self.running_var if tracked else None,
            self.num_batches_tracked,
            momentum,
            self.eps,
            group,
        )

    def __deepcopy__(self, memo):
        # As the default deepcopy, except that the card group is shared: a process group
        # cannot be copied (EMA hooks deepcopy the model).
        if self.card_group is not None:
            memo.setdefault(id(self.card_group), self.card_group)
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        for key, value in self.__dict__.items():
            copied.__dict__[key] = copy.deepcopy(value, memo)
        return copied

    def __getstate__(self):
        getstate = getattr(super(), "__getstate__", None)  # not on torch 1.10 + Python 3.8
        state = dict(getstate() if getstate is not None else self.__dict__)
        state["card_group"] = None  # a process group cannot be pickled; set it again
        return state


def _sync_bn_types():
    """torch's SyncBatchNorm (mmcv's ``SyncBN``) and, when loaded, ``mmcv.ops`` MMSyncBN."""
    types = [torch.nn.SyncBatchNorm]
    mmcv_sync_bn = sys.modules.get("mmcv.ops.sync_bn")  # a model with one has imported it
    if mmcv_sync_bn is not None:
        types.append(mmcv_sync_bn.SyncBatchNorm)
    return tuple(types)


def _moved(source: torch.nn.Module, target: torch.nn.Module) -> torch.nn.Module:
    """``target`` holding ``source``'s parameters, buffers and training flag (same tensors)."""
    if source.affine:
        target.weight = source.weight
        target.bias = source.bias
    target.running_mean = source.running_mean
    target.running_var = source.running_var
    target.num_batches_tracked = source.num_batches_tracked
    target.training = source.training
    if hasattr(source, "qconfig"):
        target.qconfig = source.qconfig
    return target


def convert_gcu_sync_batchnorm(module: torch.nn.Module, card_group) -> torch.nn.Module:
    """``module`` with every SyncBN layer replaced by a :class:`GCUSyncBatchNorm`.

    Replaced: ``torch.nn.SyncBatchNorm`` (what ``norm_cfg=dict(type='SyncBN')`` builds) and
    mmcv's ``mmcv.ops.SyncBatchNorm`` (``MMSyncBN``; its ``stats_mode`` is dropped: the union
    is always weighted by counts, as its ``'N'`` mode). Each keeps the layer's parameters and
    buffers (the same tensors, so the same device, dtype and ``requires_grad``), its
    options and training flag, and gets ``card_group``. Existing ``GCUSyncBatchNorm`` layers
    get ``card_group`` too; plain BatchNorm layers are left alone. State-dict keys do not
    change. Like torch's ``convert_sync_batchnorm``, returns the module (replaced if it is
    itself a SyncBN layer).
    """
    output = module
    if isinstance(module, GCUSyncBatchNorm):
        module.card_group = card_group
    elif isinstance(module, _sync_bn_types()):
        output = _moved(
            module,
            GCUSyncBatchNorm(
                module.num_features,
                module.eps,
                module.momentum,
                module.affine,
                module.track_running_stats,
                card_group=card_group,
            ),
        )
    for name, child in module.named_children():
        output.add_module(name, convert_gcu_sync_batchnorm(child, card_group))
    return output


def revert_gcu_sync_batchnorm(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every :class:`GCUSyncBatchNorm` replaced by a plain BatchNorm.

    mmengine's ``revert_sync_batchnorm`` knows only torch's and mmcv's SyncBN; this turns
    GCUSyncBN layers into the same plain BatchNorm it makes, keeping their tensors.
    """
    output = module
    if isinstance(module, GCUSyncBatchNorm):
        output = _moved(
            module,
            BatchNormXd(
                module.num_features,
                module.eps,
                module.momentum,
                module.affine,
                module.track_running_stats,
            ),
        )
    for name, child in module.named_children():
        output.add_module(name, revert_gcu_sync_batchnorm(child))
    return output
