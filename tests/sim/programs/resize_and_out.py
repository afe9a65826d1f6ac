"""resize_ and out= on card 1, and what card 1 then holds (torch_gcu 2.x)."""

import json

import sim_alone  # noqa: F401

from mmgcu.sim import install

install()
import torch  # noqa: E402

x = torch.empty(0, device="gcu:1")
x.resize_(1024)
a = torch.ones(4, device="gcu:1")
o = torch.empty(0, device="gcu:1")
torch.add(a, a, out=o)
print(
    json.dumps(
        {"resized": list(x.shape), "out": list(o.shape), "bytes": torch.gcu.memory_allocated(1)}
    )
)
