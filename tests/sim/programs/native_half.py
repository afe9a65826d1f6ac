"""tests/sim/test_native.py's program: half on simulated cards (see native_setup)."""
# ruff: noqa: B023  (each case runs within its own loop iteration)

import torch
import torch.nn.functional as F
from native_setup import finish, install

ext, KIND, D0, D1 = install()

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
        # out= forms (torch 1.10's structured mm sends a card's mm to mm.out)
        "mm_out": lambda t: torch.mm(t(a), t(m), out=t(c)),
        "addmm_out": lambda t: torch.addmm(t(c), t(a), t(m), out=t(c)),
        "bmm_out": lambda t: torch.bmm(t(ba), t(bm), out=t(bc3)),
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
finish(out)
