"""gelu_backward of a transposed gradient on a card, against the CPU on contiguous tensors.

torch 1.10's CPU kernel returns memory it never wrote for this layout; a T20 (torch_xla 1.10
lowers the op, and an XLA tensor has no strides) computes it right.
"""

import json

import sim_alone  # noqa: F401

import mmgcu.sim
from mmgcu.sim import install

install()
import torch  # noqa: E402

CARD = "gcu:0" if mmgcu.sim.state.api == "gcu2" else "xla:0"

torch.manual_seed(0)
grad = torch.randn(2, 16, 64)
x = torch.randn(2, 64, 16)
expected = torch.ops.aten.gelu_backward(grad.permute(0, 2, 1).contiguous(), x)
on_card = torch.ops.aten.gelu_backward(grad.to(CARD).permute(0, 2, 1), x.to(CARD)).cpu()
print(json.dumps({"max_diff": float((on_card - expected).abs().nan_to_num(float("inf")).max())}))
