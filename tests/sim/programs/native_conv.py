"""tests/sim/test_native.py's program: conv on simulated cards (see native_setup)."""

import torch
import torch.nn.functional as F
from native_setup import finish, install

ext, KIND, D0, D1 = install()

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
finish(out)
