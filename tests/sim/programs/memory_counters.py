"""The simulator's memory counters on card 3 (and 5) through allocations, views and frees.

Run with MMGCU_SIMULATE=8 and MMGCU_SIMULATE_API; the counters are read through the
functions both generations build on (``mmgcu.sim.memory``; ``torch.gcu`` on 2.x).
"""

import json

import sim_alone  # noqa: F401

import mmgcu.sim
from mmgcu.sim import install

install()
import torch  # noqa: E402

if mmgcu.sim.state.api == "gcu2":
    mem = torch.gcu
    kind = "gcu"
else:
    from mmgcu.sim import memory as mem

    kind = "xla"
card = torch.device(kind, 3)
out = {}


def snap(name):
    out[name] = {
        "now": mem.memory_allocated(3),
        "peak": mem.max_memory_allocated(3),
        "others": [mem.memory_allocated(i) for i in range(8) if i != 3],
        "other_peaks": [mem.max_memory_allocated(i) for i in range(8) if i != 3],
    }


snap("start")
x = torch.empty(1024, dtype=torch.float32, device=card)
snap("alloc")
views = [x.view(32, 32), x[10:20], x.view(32, 32).t(), x.detach()]
snap("views")
y = x + 1
snap("result")
h = torch.ones(1024, dtype=torch.float16).to(card)
snap("moved")
del h
del y
snap("del_result")
del views
snap("del_views")
del x
snap("del_all")
mem.reset_peak_memory_stats(3)
snap("reset")
z = torch.ones(256, device=torch.device(kind, 5))
out["card5"] = mem.memory_allocated(5)
out["card3_with_card5"] = mem.memory_allocated(3)
out["by_device_arg"] = mem.memory_allocated(torch.device(kind, 5))
del z
out["card5_after"] = mem.memory_allocated(5)
print(json.dumps(out))
