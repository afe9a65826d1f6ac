"""``import mmgcu``, then how many simulated cards torch_gcu shows (None: no torch_gcu)."""

import json

import mmgcu  # noqa: F401

try:
    import torch_gcu

    cards = torch_gcu.gcu if hasattr(torch_gcu, "gcu") else torch_gcu
    out = {"cards": cards.device_count()}
except ImportError:
    out = {"cards": None}
print(json.dumps(out))
