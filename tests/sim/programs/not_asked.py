"""What loading the simulator changes when nothing asks for it (no MMGCU_* variable)."""

import json
import sys

import sim_alone  # noqa: F401
import torch

import mmgcu.sim

out = {
    "requested": mmgcu.sim.requested(),
    "installed": mmgcu.sim.is_installed(),
    "in_modules": "torch_gcu" in sys.modules,
    "backend_name": getattr(torch._C, "_get_privateuse1_backend_name", lambda: None)(),
    "torch_gcu_attr": hasattr(torch, "gcu"),
}
try:
    import torch_gcu  # noqa: F401

    out["import"] = None
except ImportError as e:
    out["import"] = type(e).__name__
print(json.dumps(out))
