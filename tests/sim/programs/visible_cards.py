"""The cards the installed simulator shows (run with MMGCU_SIMULATE, MMGCU_SIMULATE_API and
TOPS_VISIBLE_DEVICES): its count, a card that is not there, the current card."""

import json

import sim_alone  # noqa: F401

import mmgcu.sim
from mmgcu.sim import install

first = install()
import torch  # noqa: E402
import torch_gcu  # noqa: E402

api = mmgcu.sim.state.api
kind = "gcu" if api == "gcu2" else "xla"
cards = torch.gcu if api == "gcu2" else torch_gcu
out = {"api": api, "same": install() is first is torch_gcu, "count": cards.device_count()}
try:
    cards.set_device(5)
    out["set_5"] = None
except RuntimeError as e:
    out["set_5"] = str(e)
out["current_after_set_5"] = cards.current_device()
cards.set_device(2)
out["current"] = cards.current_device()
out["default_card"] = str(torch.empty(1, device=kind).device)
try:
    torch.empty(1, device=f"{kind}:5")
    out["tensor_on_5"] = None
except RuntimeError as e:
    out["tensor_on_5"] = str(e)
print(json.dumps(out))
