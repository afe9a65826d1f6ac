"""install() with what MMGCU_SIMULATE and MMGCU_SIMULATE_API say: the ValueError, if any."""

import json
import sys

import sim_alone  # noqa: F401

import mmgcu.sim
from mmgcu.sim import install

try:
    install()
    out = {"error": None}
except ValueError as e:
    out = {"error": str(e)}
out["installed"] = mmgcu.sim.is_installed() or "torch_gcu" in sys.modules
print(json.dumps(out))
