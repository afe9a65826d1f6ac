"""tests/sim/test_native.py's program: amp on simulated cards (see native_setup)."""

import math
import struct

import torch
from native_setup import finish, install

ext, KIND, D0, D1 = install()


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def ref_unscale(grads, found, inv):
    # torch 1.10's CUDA kernel: grad * inv_scale in float, found_inf = 1 on any inf/NaN.
    out = []
    for g in grads:
        if any(not math.isfinite(v) for v in g):
            found = 1.0
        out.append(g if inv == 1.0 else [f32(v * inv) for v in g])
    return out, found


def ref_update(scale, tracker, found, growth, backoff, interval):
    if found:
        return f32(scale * backoff), 0
    if tracker + 1 == interval:
        return f32(scale * growth), 0
    return scale, tracker + 1


def same(a, b):
    return all((x == y) or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


out = {"unscale": [], "update": []}
ext.reset_host_reads()
grads_py = [[1.0, -2.5, 3.25], [0.5, 1e-3], [4.0, float("inf"), 1.0], [float("nan"), 2.0]]
grads_py = [[f32(v) for v in g] for g in grads_py]  # the values float32 tensors hold
for inv in (0.5, 1.0, f32(1 / 3)):
    for subset in ([0, 1], [0, 2], [3], [0, 1, 2, 3]):
        gp = [grads_py[i] for i in subset]
        grads = [torch.tensor(g, device=D0) for g in gp]
        found = torch.zeros(1, device=D0)
        inv_t = torch.full((1,), inv, device=D0)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv_t)
        want, want_found = ref_unscale(gp, 0.0, inv)
        got = [g.cpu().tolist() for g in grads]
        out["unscale"].append(
            [
                all(same(a, b) for a, b in zip(got, want)),
                found.cpu().item() == want_found,
                [str(g.device) for g in grads],
            ]
        )
# float16 grads: unscaled in float, rounded to float16, as CUDA does.
g16 = torch.tensor([1.0, 3.0, 1000.0], dtype=torch.float16)
card16 = g16.to(D0)
found = torch.zeros(1, device=D0)
torch._amp_foreach_non_finite_check_and_unscale_([card16], found, torch.full((1,), 0.1, device=D0))
out["half"] = [
    str(card16.dtype),
    torch.equal(card16.cpu(), (g16.float() * torch.tensor(0.1)).half()),
    found.cpu().item(),
]

scale = torch.full((1,), 1024.0, device=D0)
tracker = torch.zeros(1, dtype=torch.int32, device=D0)
ref_scale, ref_tracker = 1024.0, 0
for _step, found_v in enumerate([0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0]):
    found = torch.full((1,), float(found_v), device=D0)
    ret = torch._amp_update_scale_(scale, tracker, found, 2.0, 0.5, 3)
    ref_scale, ref_tracker = ref_update(ref_scale, ref_tracker, found_v, 2.0, 0.5, 3)
    out["update"].append(
        [
            ret is scale,
            scale.cpu().item() == ref_scale,
            tracker.cpu().item() == ref_tracker,
            str(scale.device),
            str(tracker.device),
        ]
    )
ext.reset_host_reads()
torch._amp_update_scale_(scale, tracker, torch.zeros(1, device=D0), 2.0, 0.5, 3)
torch._amp_foreach_non_finite_check_and_unscale_(
    [torch.ones(3, device=D0)], torch.zeros(1, device=D0), torch.ones(1, device=D0)
)
out["host_reads"] = ext.host_reads()
try:
    torch._amp_update_scale_(scale, tracker.float(), torch.zeros(1, device=D0), 2.0, 0.5, 3)
    out["bad_tracker"] = None
except RuntimeError as e:
    out["bad_tracker"] = str(e)
finish(out)
