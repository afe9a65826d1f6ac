"""Load (building if needed) the simulator's C++ part; report its file and card counts."""

import json

import sim_alone  # noqa: F401

from mmgcu.sim.build import load_extension

ext = load_extension()
before = ext.card_count()
ext.install(4)
print(json.dumps({"file": ext.__file__, "before": before, "after": ext.card_count()}))
