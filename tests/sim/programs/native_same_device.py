"""tests/sim/test_native.py's program: same device on simulated cards (see native_setup)."""

import torch
import torch.nn.functional as F
from native_setup import finish, install

ext, KIND, D0, D1 = install()


def error(fn):
    try:
        fn()
    except RuntimeError as e:
        return str(e)
    return None


x = torch.ones(1, 3, 5, 5, device=D0)
w = torch.ones(2, 3, 3, 3, device=D0)
out = {
    "cpu_and_card": error(lambda: torch.ones(3) + torch.ones(3, device=D0)),
    "card_and_cpu": error(lambda: torch.ones(3, device=D0).add_(torch.ones(3))),
    "two_cards": error(lambda: torch.ones(3, device=D0) + torch.ones(3, device=D1)),
    "mm_two_cards": error(lambda: torch.ones(2, 2, device=D0) @ torch.ones(2, 2, device=D1)),
    "conv_cpu_weight": error(lambda: F.conv2d(x, w.cpu())),
    "conv_other_card": error(lambda: F.conv2d(x, w.to(D1))),
    "conv_bias_other_card": error(lambda: F.conv2d(x, w, torch.ones(2, device=D1))),
}
finish(out)
