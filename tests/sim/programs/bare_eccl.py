"""One rank of two in an ECCL-only world: card tensors pass, CPU tensors are refused.

Run as rank RANK of WORLD_SIZE (MASTER_* set) with MMGCU_SIMULATE=2 and
MMGCU_SIMULATE_API: on 2.x torch.distributed's ``eccl`` backend, on 1.x
torch_gcu.distributed's own world. Prints what it found as one JSON line.
"""

import json
import os

import sim_alone  # noqa: F401

import mmgcu.sim
from mmgcu.sim import install

torch_gcu = install()
import torch  # noqa: E402
import torch.distributed  # noqa: E402

rank = int(os.environ["RANK"])
if mmgcu.sim.state.api == "gcu2":
    card_dist, kind = torch.distributed, "gcu"
else:
    card_dist, kind = torch_gcu.distributed, "xla"
card_dist.init_process_group("eccl")
t = torch.full((3,), float(rank + 1)).to(torch.device(kind, rank))
card_dist.all_reduce(t, card_dist.ReduceOp.SUM)
out = {"backend": card_dist.get_backend(), "card_sum": [str(t.device), t.sum().item()]}
try:
    card_dist.all_reduce(torch.ones(2), card_dist.ReduceOp.SUM)
    out["cpu"] = None
except RuntimeError as e:
    out["cpu"] = str(e)
card_dist.barrier()
print(json.dumps(out))
card_dist.destroy_process_group()
