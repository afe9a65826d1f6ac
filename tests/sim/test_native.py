"""The simulator's native part alone, on whichever torch runs the tests (2.x or 1.10).

Each test group loads the extension straight from ``mmgcu/sim/build.py`` (not through
``mmgcu.sim.install``) and installs it in a fresh interpreter: a process installs cards once,
and renames PrivateUse1 to ``gcu`` once. Cards are ``xla`` on both torch generations (the
torch_gcu 1.x device type) and also ``gcu`` on torch >= 2 (torch_gcu 2.x).
"""

import importlib.util
import os
import os.path as osp
import shutil
import sys

import pytest
import torch

from tests.conftest import REPO, last_json, run_python

BUILD_PY = osp.join(REPO, "mmgcu", "sim", "build.py")
TORCH2 = int(torch.__version__.split(".")[0]) >= 2
DEVICE_TYPES = ["xla", "gcu"] if TORCH2 else ["xla"]


def load_build_module():
    """mmgcu/sim/build.py as a module of its own (the mmgcu package is not imported)."""
    spec = importlib.util.spec_from_file_location("mmgcu_sim_build", BUILD_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PRELUDE = """\
import importlib.util
import json
import os
import sys
import types

import torch

_spec = importlib.util.spec_from_file_location("mmgcu_sim_build", {build!r})
_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_build)
ext = _build.load_extension()
ext.install({cards})
if {kind!r} == "gcu":  # as torch_gcu 2.x does: rename PrivateUse1, register torch.gcu
    torch.utils.rename_privateuse1_backend("gcu")
    torch._register_device_module("gcu", types.ModuleType("torch.gcu"))
KIND = {kind!r}
D0 = torch.device(KIND, 0)
D1 = torch.device(KIND, 1)
"""

# A snippet ends without interpreter teardown. After a backward on a card, PyTorch's autograd
# thread for that device may still be releasing its last graph task, which needs the GIL; a
# Python 3.11 interpreter finalizing meanwhile ends that thread inside a noexcept destructor
# ("terminate called without an active exception", about 1 run in 20 here). An exception
# raised before this line still fails the snippet.
EPILOGUE = """
sys.stdout.flush()
os._exit(0)
"""


def native_json(code, kind="xla", cards=4):
    """Run ``code`` after installing ``cards`` simulated cards of ``kind``; its last JSON."""
    prelude = PRELUDE.format(build=BUILD_PY, cards=cards, kind=kind)
    return last_json(run_python(prelude + code + EPILOGUE, timeout=600).stdout)


# ---------------------------------------------------------------------------- placement
PLACEMENT = """
out = {}
made = {
    "empty": torch.empty(3, device=D1),
    "zeros": torch.zeros(2, 3, device=D0),
    "ones": torch.ones(4, device=D0),
    "full": torch.full((2,), 7.0, device=D0),
    "arange": torch.arange(5, device=D0),
    "rand": torch.rand(2, device=D0),
    "randn": torch.randn(2, 2, device=D0),
    "strided": torch.empty_strided((2, 3), (1, 2), device=D0),
}
out["factories"] = {k: str(v.device) for k, v in made.items()}
out["strided_stride"] = list(made["strided"].stride())
x = torch.arange(6.0).view(2, 3)
out["roundtrip"] = x.to(D0).cpu().tolist()
out["card_to_card"] = str(x.to(D0).to(D1).device)
out["card_to_card_values"] = x.to(D0).to(D1).cpu().tolist()

t = torch.zeros(3, device=D0)
r = t.add_(2)
out["inplace"] = [r is t, str(t.device), t.cpu().tolist()]
v = torch.zeros(2, 2, device=D0)
v.t()[0].fill_(7)
out["view_shares"] = v.cpu().tolist()
out["view_device"] = str(v[0].device)
out["reshape_shares"] = torch.arange(4.0, device=D0).reshape(2, 2).add_(1).cpu().tolist()
o = torch.empty(0, device=D0)
r = torch.add(torch.ones(3, device=D0), 1, out=o)
out["out"] = [r is o, str(o.device), o.cpu().tolist()]
out["cpu_indices"] = torch.arange(5.0, device=D0)[torch.tensor([0, 2])].cpu().tolist()
out["cpu_scalar_mixes"] = (torch.ones(3, device=D0) * torch.tensor(2.0)).cpu().tolist()
out["sum_device"] = str(torch.ones(3, device=D1).sum().device)

ext.set_device(2)
out["current"] = ext.current_device()
out["default_card"] = str(torch.empty(1, device=KIND).device)
ext.set_device(0)
try:
    torch.empty(1, device=torch.device(KIND, 7))
    out["invalid"] = None
except RuntimeError as e:
    out["invalid"] = str(e)

# Memory: counted on the card that holds it, with the peak.
before = ext.memory_allocated(3)
ext.reset_peak(3)
big = torch.empty(1000, dtype=torch.float32, device=torch.device(KIND, 3))
out["mem_after_alloc"] = ext.memory_allocated(3) - before
out["mem_other_card"] = ext.memory_allocated(2)
del big
out["mem_after_free"] = ext.memory_allocated(3) - before
out["peak"] = ext.max_memory_allocated(3) - before
ext.reset_peak(3)
out["peak_after_reset"] = ext.max_memory_allocated(3) - before
out["card_count"] = ext.card_count()
print(json.dumps(out))
"""


@pytest.mark.parametrize("kind", DEVICE_TYPES)
def test_tensors_land_on_the_card(kind):
    out = native_json(PLACEMENT, kind=kind)
    d0, d1 = f"{kind}:0", f"{kind}:1"
    assert out["factories"] == {
        "empty": d1,
        "zeros": d0,
        "ones": d0,
        "full": d0,
        "arange": d0,
        "rand": d0,
        "randn": d0,
        "strided": d0,
    }
    assert out["strided_stride"] == [1, 2]
    assert out["roundtrip"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert out["card_to_card"] == d1
    assert out["card_to_card_values"] == out["roundtrip"]
    assert out["inplace"] == [True, d0, [2.0, 2.0, 2.0]]
    assert out["view_shares"] == [[7.0, 0.0], [7.0, 0.0]]
    assert out["view_device"] == d0
    assert out["reshape_shares"] == [[1.0, 2.0], [3.0, 4.0]]
    assert out["out"] == [True, d0, [2.0, 2.0, 2.0]]
    assert out["cpu_indices"] == [0.0, 2.0]
    assert out["cpu_scalar_mixes"] == [2.0, 2.0, 2.0]
    assert out["sum_device"] == d1
    assert out["current"] == 2
    assert out["default_card"] == f"{kind}:2"  # an index-less device means the current card
    assert "ordinal 7 is invalid: 4 card(s)" in out["invalid"]
    assert out["mem_after_alloc"] == 4000
    assert out["mem_other_card"] == 0
    assert out["mem_after_free"] == 0
    assert out["peak"] == 4000
    assert out["peak_after_reset"] == 0
    assert out["card_count"] == 4


# ---------------------------------------------------------------------------- devices
SAME_DEVICE = """
import torch.nn.functional as F

def error(fn):
    try:
        fn()
    except RuntimeError as e:
        return str(e)
    return None

x = torch.ones(1, 3, 5, 5, device=D0)
w = torch.ones(2, 3, 3, 3, device=D0)
out = {
    "cpu_and_card": error(lambda: torch.ones(3) + torch.ones(3, device=D0)),
    "card_and_cpu": error(lambda: torch.ones(3, device=D0).add_(torch.ones(3))),
    "two_cards": error(lambda: torch.ones(3, device=D0) + torch.ones(3, device=D1)),
    "mm_two_cards": error(lambda: torch.ones(2, 2, device=D0) @ torch.ones(2, 2, device=D1)),
    "conv_cpu_weight": error(lambda: F.conv2d(x, w.cpu())),
    "conv_other_card": error(lambda: F.conv2d(x, w.to(D1))),
    "conv_bias_other_card": error(lambda: F.conv2d(x, w, torch.ones(2, device=D1))),
}
print(json.dumps(out))
"""


@pytest.mark.parametrize("kind", DEVICE_TYPES)
def test_mixed_devices_fail_with_pytorchs_own_error(kind):
    out = native_json(SAME_DEVICE, kind=kind)
    for case, message in out.items():
        assert message is not None, case
        assert "Expected all tensors to be on the same device" in message, (case, message)
    assert "cpu" in out["cpu_and_card"] and f"{kind}:0" in out["cpu_and_card"]
    assert f"{kind}:0" in out["two_cards"] and f"{kind}:1" in out["two_cards"]


# ---------------------------------------------------------------------------- convolution
CONV = """
import torch.nn.functional as F

torch.manual_seed(0)
x = torch.randn(2, 3, 9, 9)
w = torch.randn(4, 3, 3, 3)
b = torch.randn(4)
out = {}
for name, kwargs in (("plain", {"padding": 1}), ("strided", {"stride": 2, "dilation": 2})):
    xc, wc, bc = [t.to(D0).requires_grad_() for t in (x, w, b)]
    xr, wr, br = [t.clone().requires_grad_() for t in (x, w, b)]
    yc = F.conv2d(xc, wc, bc, **kwargs)
    yr = F.conv2d(xr, wr, br, **kwargs)
    yc.square().sum().backward()
    yr.square().sum().backward()
    out[name] = {
        "devices": [str(t.device) for t in (yc, xc.grad, wc.grad, bc.grad)],
        "forward": torch.allclose(yc.cpu(), yr, atol=1e-5),
        "grad_input": torch.allclose(xc.grad.cpu(), xr.grad, atol=1e-4),
        "grad_weight": torch.allclose(wc.grad.cpu(), wr.grad, atol=1e-4),
        "grad_bias": torch.allclose(bc.grad.cpu(), br.grad, atol=1e-4),
    }
# Transposed and grouped, forward and backward.
xt = torch.randn(1, 4, 5, 5)
wt = torch.randn(4, 2, 3, 3)
xc, wc = xt.to(D0).requires_grad_(), wt.to(D0).requires_grad_()
xr, wr = xt.clone().requires_grad_(), wt.clone().requires_grad_()
yc = F.conv_transpose2d(xc, wc, groups=2, stride=2)
yr = F.conv_transpose2d(xr, wr, groups=2, stride=2)
yc.sum().backward()
yr.sum().backward()
out["transposed"] = {
    "devices": [str(yc.device), str(xc.grad.device), str(wc.grad.device)],
    "forward": torch.allclose(yc.cpu(), yr, atol=1e-5),
    "grad_input": torch.allclose(xc.grad.cpu(), xr.grad, atol=1e-4),
    "grad_weight": torch.allclose(wc.grad.cpu(), wr.grad, atol=1e-4),
    "grad_bias": True,
}
print(json.dumps(out))
"""


@pytest.mark.parametrize("kind", DEVICE_TYPES)
def test_convolution_forward_and_backward_equal_cpu(kind):
    out = native_json(CONV, kind=kind)
    for case, result in out.items():
        assert set(result.pop("devices")) == {f"{kind}:0"}, case
        assert all(result.values()), (case, result)


# ---------------------------------------------------------------------------- half precision
HALF = """
import torch.nn.functional as F

torch.manual_seed(0)
TOL = {"float16": 1e-2, "bfloat16": 4e-2}

def close(card, ref, dtype_name):
    # Relative to the result's scale: what rounding the float32 result to half leaves.
    card = card.cpu().float()
    scale = ref.abs().max().item() or 1.0
    return (card - ref).abs().max().item() <= TOL[dtype_name] * scale

out = {}
for dtype in (torch.float16, torch.bfloat16):
    name = str(dtype).split(".")[1]
    res = {}
    # Inputs exactly representable in the half type, so the reference sees the same values.
    x = torch.randn(2, 3, 8, 8).to(dtype)
    w = torch.randn(4, 3, 3, 3).to(dtype)
    b = torch.randn(4).to(dtype)
    xc, wc, bc = [t.to(D0).requires_grad_() for t in (x, w, b)]
    y = F.conv2d(xc, wc, bc, padding=1)
    xr, wr, br = [t.float().requires_grad_() for t in (x, w, b)]
    yr = F.conv2d(xr, wr, br, padding=1)
    gy = torch.randn(yr.shape).to(dtype)
    y.backward(gy.to(D0))
    yr.backward(gy.float())
    res["conv"] = [str(y.dtype), str(y.device), close(y, yr, name)]
    res["conv_grads"] = [
        [str(t.grad.dtype), str(t.grad.device), close(t.grad, r.grad, name)]
        for t, r in ((xc, xr), (wc, wr), (bc, br))
    ]
    a = torch.randn(5, 6).to(dtype)
    m = torch.randn(6, 7).to(dtype)
    c = torch.randn(5, 7).to(dtype)
    ba = torch.randn(3, 5, 6).to(dtype)
    bm = torch.randn(3, 6, 7).to(dtype)
    bc3 = torch.randn(3, 5, 7).to(dtype)
    vec = torch.randn(6).to(dtype)
    lw = torch.randn(7, 6).to(dtype)
    lb = torch.randn(7).to(dtype)
    cases = {
        "mm": lambda t: torch.mm(t(a), t(m)),
        "addmm": lambda t: torch.addmm(t(c), t(a), t(m)),
        "bmm": lambda t: torch.bmm(t(ba), t(bm)),
        "baddbmm": lambda t: torch.baddbmm(t(bc3), t(ba), t(bm)),
        "mv": lambda t: torch.mv(t(a), t(vec)),
        "dot": lambda t: torch.dot(t(vec), t(vec)),
        "matmul_3d_2d": lambda t: torch.matmul(t(ba), t(m)),
        "matmul_3d_3d": lambda t: torch.matmul(t(ba), t(bm)),
        "linear_2d": lambda t: F.linear(t(a), t(lw), t(lb)),
        "linear_3d": lambda t: F.linear(t(ba), t(lw), t(lb)),
        "linear_no_bias": lambda t: F.linear(t(ba), t(lw)),
    }
    for case, fn in cases.items():
        got = fn(lambda t: t.to(D0))
        ref = fn(lambda t: t.float())
        res[case] = [str(got.dtype), str(got.device), close(got, ref, name)]
    # Element-wise ops torch 1.10's CPU has no half kernel for ('"clamp_min_cpu" not
    # implemented for 'Half''), in and out of place, and their backward.
    act = torch.randn(2, 3, 4).to(dtype)
    got = F.relu(act.to(D0))
    res["relu"] = [str(got.dtype), str(got.device), close(got, F.relu(act.float()), name)]
    inplace = act.to(D0)
    same = inplace.relu_() is inplace
    kept = close(inplace, F.relu(act.float()), name) and same
    res["relu_"] = [str(inplace.dtype), str(inplace.device), kept]
    xg = act.to(D0).requires_grad_()
    F.relu(xg * 2).float().sum().backward()
    ref = (act.float() > 0).float() * 2
    res["relu_grad"] = [str(xg.grad.dtype), str(xg.grad.device), close(xg.grad, ref, name)]
    # Backward through linear: the gradients keep the half type too.
    lwc = lw.to(D0).requires_grad_()
    F.linear(ba.to(D0), lwc).float().sum().backward()  # a float32 loss, as autocast makes
    res["linear_grad"] = [str(lwc.grad.dtype), str(lwc.grad.device)]
    out[name] = res
# Mixed half and float32 inputs are refused as PyTorch refuses them.
try:
    torch.mm(torch.ones(2, 2, dtype=torch.float16, device=D0), torch.ones(2, 2, device=D0))
    out["mixed"] = None
except RuntimeError as e:
    out["mixed"] = str(e)
print(json.dumps(out))
"""


@pytest.mark.parametrize("kind", DEVICE_TYPES)
def test_half_precision_keeps_its_dtype_and_is_close_to_float32(kind):
    out = native_json(HALF, kind=kind)
    card = f"{kind}:0"
    for dtype in ("float16", "bfloat16"):
        res = out[dtype]
        want = f"torch.{dtype}"
        assert res.pop("conv_grads") == [[want, card, True]] * 3, dtype
        assert res.pop("linear_grad") == [want, card], dtype
        for case, result in res.items():
            assert result == [want, card, True], (dtype, case, result)
    assert out["mixed"] is not None


# ---------------------------------------------------------------------------- host reads
HOST_READS = """
import threading

import torch.nn.functional as F

t = torch.tensor([1.5], device=D0)
m = torch.ones(2, 3, device=D0)
reads = {}

def record(name):
    reads[name] = ext.host_reads()

ext.reset_host_reads()
record("start")
# Work that stays on the card reads nothing back.
y = F.conv2d(torch.ones(1, 1, 4, 4, device=D0), torch.ones(1, 1, 3, 3, device=D0))
z = (m @ m.t()).relu_().sum()
torch.ones(3).to(D0).to(D1)
alias = ext.host_alias(m)
alias.add_(1)
record("card_work")
t.item()
record("item")
float(t)
record("float")
bool(t)
record("bool")
int(torch.tensor(3, device=D0))
record("int")
m.cpu()
record("cpu")
m.to("cpu")
record("to_cpu")
m.tolist()
record("tolist")
m.cpu().numpy()
record("numpy")
torch.empty(2, 3).copy_(m)
record("copy_")

# The counters are shared by every thread and lose no count.
ext.reset_host_reads()
def reader():
    for _ in range(200):
        t.item()
threads = [threading.Thread(target=reader) for _ in range(4)]
for th in threads:
    th.start()
for th in threads:
    th.join()
record("threads")
ext.reset_host_reads()
record("reset")
print(json.dumps(reads))
"""


@pytest.mark.parametrize("kind", DEVICE_TYPES)
def test_host_reads_are_counted(kind):
    reads = native_json(HOST_READS, kind=kind)
    counts = {k: (v["scalar_reads"], v["copies_to_host"]) for k, v in reads.items()}
    assert counts == {
        "start": (0, 0),
        "card_work": (0, 0),  # ops, uploads, card-to-card copies and host_alias read nothing
        "item": (1, 0),
        "float": (2, 0),
        "bool": (3, 0),
        "int": (4, 0),
        "cpu": (4, 1),
        "to_cpu": (4, 2),
        "tolist": (4, 3),
        "numpy": (4, 4),
        "copy_": (4, 5),
        "threads": (800, 0),
        "reset": (0, 0),
    }


# ---------------------------------------------------------------------------- grad scaler
AMP = """
import math
import struct

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
            [all(same(a, b) for a, b in zip(got, want)), found.cpu().item() == want_found,
             [str(g.device) for g in grads]]
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
for step, found_v in enumerate([0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0]):
    found = torch.full((1,), float(found_v), device=D0)
    ret = torch._amp_update_scale_(scale, tracker, found, 2.0, 0.5, 3)
    ref_scale, ref_tracker = ref_update(ref_scale, ref_tracker, found_v, 2.0, 0.5, 3)
    out["update"].append([
        ret is scale, scale.cpu().item() == ref_scale, tracker.cpu().item() == ref_tracker,
        str(scale.device), str(tracker.device),
    ])
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
print(json.dumps(out))
"""


@pytest.mark.parametrize("kind", DEVICE_TYPES)
def test_grad_scaler_kernels_match_the_cuda_semantics(kind):
    # On torch 1.10 these are the simulator's own kernels (CPU has none); on torch >= 2 the
    # CPU kernels run through the fallback: the same semantics either way.
    out = native_json(AMP, kind=kind)
    card = f"{kind}:0"
    for values, found, devices in out["unscale"]:
        assert values and found and set(devices) == {card}
    assert out["half"] == ["torch.float16", True, 0.0]
    assert out["update"] == [[True, True, True, card, card]] * 13
    assert out["host_reads"] == {"scalar_reads": 0, "copies_to_host": 0}
    assert out["bad_tracker"] is not None and "growth_tracker" in out["bad_tracker"]


# ---------------------------------------------------------------------------- build
def test_build_picks_the_source_for_the_torch_generation():
    build = load_build_module()
    assert osp.basename(build.source_for("2.13.0+cpu")) == "gcu_sim.cpp"
    assert osp.basename(build.source_for("2.1.0")) == "gcu_sim.cpp"
    assert osp.basename(build.source_for("1.10.2+cu102")) == "gcu_sim_torch110.cpp"
    assert osp.basename(build.source_for("1.10.0a0+git36449ea")) == "gcu_sim_torch110.cpp"
    for version in ("1.9.0", "1.11.0", "1.13.1"):
        with pytest.raises(RuntimeError, match="torch >= 2 .* or torch 1.10"):
            build.source_for(version)


def test_build_key_covers_every_source_and_the_toolchain(tmp_path, monkeypatch):
    build = load_build_module()
    for name in os.listdir(build.CSRC):
        shutil.copy(osp.join(build.CSRC, name), tmp_path / name)
    monkeypatch.setattr(build, "CSRC", str(tmp_path))
    source = str(tmp_path / "gcu_sim.cpp")

    def key():
        return build.build_key(source, "2.13.0", "/usr/bin/ninja")

    first = key()
    assert key() == first
    assert build.build_key(source, "2.13.0", "/venv/bin/ninja") != first
    assert build.build_key(source, "1.10.2", "/usr/bin/ninja") != first
    for name in ("gcu_sim.h", "gcu_sim_torch110.cpp"):
        before = key()
        with open(tmp_path / name, "a") as f:
            f.write("\n// changed\n")
        assert key() != before, name


def test_build_runs_the_ninja_of_its_own_environment(tmp_path, monkeypatch):
    # However PATH is set (an activated venv or none), the build finds the ninja beside
    # sys.executable first, so two shells never rebuild each other's build folder.
    build = load_build_module()
    env_bin = tmp_path / "env" / "bin"
    env_bin.mkdir(parents=True)
    ninja = env_bin / "ninja"
    ninja.write_text("#!/bin/sh\n")
    ninja.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(env_bin / "python"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with build._env_bin_first_on_path():
        assert shutil.which("ninja") == str(ninja)
    assert os.environ["PATH"] == "/usr/bin:/bin"
