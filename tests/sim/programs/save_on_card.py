"""Save card tensors, a Parameter and optimizer state on card 2 to ``sys.argv[1]``.

Run with MMGCU_SIMULATE=4 and MMGCU_SIMULATE_API.
"""

import json
import sys

import sim_alone  # noqa: F401

import mmgcu.sim
from mmgcu.sim import install

install()
import torch  # noqa: E402

path = sys.argv[1]
card = torch.device("gcu" if mmgcu.sim.state.api == "gcu2" else "xla", 2)
tensor = (torch.arange(6, dtype=torch.float32) * 1.5).to(card)
param = torch.nn.Parameter(torch.full((3,), 0.5).to(card))
opt = torch.optim.SGD([param], lr=0.1, momentum=0.9)
param.grad = torch.ones(3).to(card)
opt.step()  # param 0.5 - 0.1 * 1 = 0.4; momentum buffer = grad = 1
state = opt.state_dict()
torch.save({"tensor": tensor, "param": param, "optim": state}, path)
print(
    json.dumps(
        {
            "devices": [
                str(tensor.device),
                str(param.device),
                str(state["state"][0]["momentum_buffer"].device),
            ],
            "is_param": isinstance(param, torch.nn.Parameter),
        }
    )
)
