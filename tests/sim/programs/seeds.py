"""Card random numbers after torch.manual_seed and torch.gcu.manual_seed (torch_gcu 2.x)."""

import json

import sim_alone  # noqa: F401

from mmgcu.sim import install

install()
import torch  # noqa: E402

torch.manual_seed(7)
a = torch.randn(3, device="gcu:0").sum().item()
torch.gcu.manual_seed(7)
b = torch.randn(3, device="gcu:0").sum().item()
torch.manual_seed(8)
c = torch.randn(3, device="gcu:0").sum().item()
print(json.dumps({"a": a, "b": b, "c": c}))
