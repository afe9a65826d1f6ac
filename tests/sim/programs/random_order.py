"""Random ops on a transposed card tensor draw what they draw on a contiguous one of its shape.

Prints, for each op, whether the two draws are equal in logical order, and whether an
in-place draw into a transposed view reached the tensor it views.
"""

import json

import sim_alone  # noqa: F401

import mmgcu.sim
from mmgcu.sim import install

install()
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CARD = "gcu:0" if mmgcu.sim.state.api == "gcu2" else "xla:0"
DRAWS = {
    "dropout": lambda t: F.dropout(t, 0.25, training=True),
    "bernoulli_": lambda t: t.bernoulli_(0.5),
    "uniform_": lambda t: t.uniform_(),
    "normal_": lambda t: t.normal_(),
    "rand_like": lambda t: torch.rand_like(t),
}


def draw(fn, transposed: bool):
    torch.manual_seed(3)
    if transposed:
        t = torch.ones(64, 2, 300, device=CARD).transpose(0, 1)
    else:
        t = torch.ones(2, 64, 300, device=CARD)
    return fn(t).cpu()


base = torch.zeros(64, 2, 300, device=CARD)
torch.manual_seed(3)
base.transpose(0, 1).bernoulli_(0.5)
print(
    json.dumps(
        {
            "same": {k: bool(torch.equal(draw(f, True), draw(f, False))) for k, f in DRAWS.items()},
            "in_place_reached": float(base.sum().item()) > 0,
        }
    )
)
