"""Make a tensor on card 5 (``sys.argv[1]``: 'empty' or 'to'); run with 3 cards: it fails."""

import sys

import sim_alone  # noqa: F401

from mmgcu.sim import install

install()
import torch  # noqa: E402

if sys.argv[1] == "empty":
    torch.empty(1, device="gcu:5")
else:
    torch.ones(1).to("gcu:5")
