"""Move a tensor on card 3 to the CPU and to card 1, three ways."""

import json

import sim_alone  # noqa: F401

import mmgcu.sim
from mmgcu.sim import install

install()
import torch  # noqa: E402

kind = "gcu" if mmgcu.sim.state.api == "gcu2" else "xla"
x = torch.arange(3, dtype=torch.float32).to(torch.device(kind, 3))
out = {}
for name, move in (
    ("cpu", lambda: x.cpu()),
    ("to_cpu", lambda: x.to("cpu")),
    ("to_other_card", lambda: x.to(torch.device(kind, 1))),
):
    try:
        moved = move()
        out[name] = [str(moved.device), type(moved).__name__, moved.sum().item()]
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
