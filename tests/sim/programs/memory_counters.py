"""The simulator's memory counters on card 3 (and 5) through allocations, views and frees.

Run with MMGCU_SIMULATE=8 and MMGCU_SIMULATE_API; the counters are read through
``torch.gcu`` on 2.x, and from the native part itself on 1.x (whose own surface has only
``get_hbm_alloc_size``, the bytes allocated now).
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

    class mem:
        """The native part's counters, by card index or xla device."""

        @staticmethod
        def _index(device):
            return device if isinstance(device, int) else device.index

        @staticmethod
        def memory_allocated(device):
            return mmgcu.sim.state.ext.memory_allocated(mem._index(device))

        @staticmethod
        def max_memory_allocated(device):
            return mmgcu.sim.state.ext.max_memory_allocated(mem._index(device))

        @staticmethod
        def reset_peak_memory_stats(device):
            mmgcu.sim.state.ext.reset_peak(mem._index(device))

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
