"""How many cards the accelerator sees under the simulator (MMGCU_SIMULATE and the
visible-device variables set). Prints one JSON line."""

import json

import mmgcu  # noqa: F401  (installs the simulated torch_gcu from MMGCU_SIMULATE)
from mmgcu.device import select_accelerator

print(json.dumps(select_accelerator().device_count()))
