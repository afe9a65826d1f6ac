"""tests/sim/test_native.py's program: op classes on non-contiguous and half card tensors.

Each case runs an op on card tensors made non-contiguous on the card (transposed, permuted,
sliced), forward and backward, and compares it with the same op on CPU float32 tensors. On
an XLA card (torch_gcu 1.x) every case must run; a strided card (torch_gcu 2.x) refuses a
view its strides cannot express, as CUDA does. Prints ``{case: [ok, dtype, error]}``.
"""
# ruff: noqa: B023  (each case runs within its own loop iteration)

import torch
import torch.nn.functional as F
from native_setup import finish, install

ext, KIND, D0, D1 = install()
torch.manual_seed(0)

x4 = torch.randn(2, 6, 5, 4)  # N, C, H, W
x3 = torch.randn(2, 7, 6)  # N, C, L
a2 = torch.randn(6, 5)
b2 = torch.randn(6, 3)
ids = torch.tensor([0, 2, 1])
w4 = torch.randn(3, 6, 3, 3)
w2 = torch.randn(4, 7)
STATS = "stats"  # running statistics: no gradient


def nchw(t):  # a permuted view whose strides are not contiguous (NHWC storage)
    return t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


CASES = {
    # norms
    "layer_norm": lambda v: F.layer_norm(v(x3).transpose(1, 2), (7,)),
    "layer_norm_affine": lambda v: F.layer_norm(
        v(x3).transpose(1, 2), (7,), v(torch.ones(7)), v(torch.zeros(7))
    ),
    "group_norm": lambda v: F.group_norm(nchw(v(x4)), 3),
    "batch_norm": lambda v: F.batch_norm(
        nchw(v(x4)), v(torch.zeros(6), STATS), v(torch.ones(6), STATS), v(torch.ones(6)), None, True
    ),
    "instance_norm": lambda v: F.instance_norm(nchw(v(x4))),
    "normalize": lambda v: F.normalize(v(x3).transpose(1, 2), dim=-1),
    # matrix products
    "mm": lambda v: torch.mm(v(a2).t(), v(b2)),
    "bmm": lambda v: torch.bmm(v(x3).transpose(1, 2), v(x3)),
    "linear": lambda v: F.linear(v(x3).transpose(1, 2), v(w2)),
    "matmul": lambda v: torch.matmul(v(x4).transpose(2, 3), v(x4)),
    # convolution and pooling
    "conv2d": lambda v: F.conv2d(nchw(v(x4)), v(w4), padding=1),
    "conv_transpose2d": lambda v: F.conv_transpose2d(nchw(v(x4)), v(w4).transpose(0, 1)),
    "max_pool2d": lambda v: F.max_pool2d(nchw(v(x4)), 2),
    "avg_pool2d": lambda v: F.avg_pool2d(nchw(v(x4)), 2),
    "adaptive_avg_pool2d": lambda v: F.adaptive_avg_pool2d(nchw(v(x4)), 3),
    "interpolate": lambda v: F.interpolate(nchw(v(x4)), scale_factor=2, mode="bilinear"),
    # indexing
    "index": lambda v: v(x3).transpose(1, 2)[:, v(ids)],
    "index_select": lambda v: torch.index_select(v(x3).transpose(1, 2), 1, v(ids)),
    "gather": lambda v: torch.gather(v(a2).t(), 1, v(ids.view(1, 3).expand(5, 3))),
    "slice_step": lambda v: v(x4)[:, ::2, 1:, ::2] * 2,
    "masked_fill": lambda v: v(a2).t().masked_fill(v(a2, STATS).t() > 0, 0.5),
    # reductions
    "sum": lambda v: v(x4).transpose(1, 3).sum(dim=(1, 2)),
    "mean": lambda v: nchw(v(x4)).mean(dim=1),
    "max": lambda v: v(x3).transpose(1, 2).max(dim=1).values,
    "softmax": lambda v: F.softmax(v(x3).transpose(1, 2), dim=-1),
    "cumsum": lambda v: torch.cumsum(v(x3).transpose(1, 2), dim=1),
    # views of non-contiguous tensors (an XLA device has no strides to refuse them)
    "view_of_transposed": lambda v: view(v(x3).transpose(1, 2), v)(2, 42),
    "flatten_transposed": lambda v: v(x4).transpose(1, 3).flatten(1),
    # in place and out=
    "inplace_on_view": lambda v: inplace_on_view(v),
    "out": lambda v: torch.add(v(a2).t(), 1.0, out=v(torch.empty(5, 6))),
}


def view(t, v):
    """``t.view`` on the card; ``t.reshape`` for the CPU reference, which has strides."""
    return t.view if v.card else t.reshape


def inplace_on_view(v):
    """A write into a transposed view reaches its base (a true alias)."""
    base = v(a2).clone()
    base.t().mul_(2.0)
    return base


def run(case, fn, dtype):
    """``[ok, dtype of the card result, error]`` of ``fn`` on the card against the CPU."""
    leaves = []

    def on_card(t, kind=None):
        leaf = t.to(dtype) if t.is_floating_point() else t
        leaf = leaf.to(D0)
        if leaf.is_floating_point() and kind is None and case not in ("out", "inplace_on_view"):
            leaf.requires_grad_()
            leaves.append(leaf)
        return leaf

    def on_cpu(t, kind=None):
        return t.to(dtype).float() if t.is_floating_point() else t

    on_card.card, on_cpu.card = True, False

    try:
        got = fn(on_card)
        ref = fn(on_cpu)
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        scale = ref.abs().max().item() or 1.0
        ok = got.device == D0 and (got.cpu().float() - ref).abs().max().item() <= tol * scale
        if leaves and got.requires_grad:
            got.float().sum().backward()
            ok = ok and all(leaf.grad is not None and leaf.grad.device == D0 for leaf in leaves)
        return [bool(ok), str(got.dtype), None]
    except RuntimeError as e:
        return [False, None, str(e).splitlines()[0]]


out = {}
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    out[str(dtype).split(".")[1]] = {case: run(case, fn, dtype) for case, fn in CASES.items()}

# Batch norm under autocast: a half input with float32 weights and statistics.
xh = x4.to(D0).half().requires_grad_()
mean, var = torch.zeros(6, device=D0), torch.ones(6, device=D0)
weight = torch.ones(6, device=D0, requires_grad=True)
try:
    y = F.batch_norm(xh, mean, var, weight, torch.zeros(6, device=D0), True)
    y.float().sum().backward()
    ref = F.batch_norm(x4.half().float(), torch.zeros(6), torch.ones(6), None, None, True)
    close = (y.cpu().float() - ref).abs().max().item() < 3e-2 * ref.abs().max().item()
    out["batch_norm_mixed"] = [
        str(y.dtype),
        str(mean.dtype),
        str(xh.grad.dtype),
        str(weight.grad.dtype),
        bool(close and mean.abs().sum().item() > 0),  # the running mean was updated
    ]
except RuntimeError as e:
    out["batch_norm_mixed"] = str(e).splitlines()[0]
finish(out)
