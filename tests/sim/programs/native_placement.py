"""tests/sim/test_native.py's program: placement on simulated cards (see native_setup)."""

import torch
from native_setup import finish, install

ext, KIND, D0, D1 = install()

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
finish(out)
