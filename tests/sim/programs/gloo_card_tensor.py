"""One rank of two: torch.distributed (gloo, torch_gcu 1.x's only group there) given a card
tensor, as mmdet's reduce_mean in Mask2Former's loss does; and a CPU tensor, which it takes.

Run as rank RANK of WORLD_SIZE=2 (MASTER_* set) with MMGCU_SIMULATE=2 and
MMGCU_SIMULATE_API=gcu1. Prints, as one JSON line, what each call gave.
"""

import json
import os

import sim_alone  # noqa: F401

from mmgcu.sim import install

torch_gcu = install()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

rank = int(os.environ["RANK"])
torch_gcu.set_device(rank)
dist.init_process_group("gloo")
out = {"rank": rank}
try:
    card = torch.ones(1, device=torch_gcu.gcu_device(rank))
    dist.all_reduce(card)
    out["card"] = None
except RuntimeError as e:
    out["card"] = str(e).splitlines()[0]
cpu = torch.ones(1)
dist.all_reduce(cpu)
out["cpu"] = cpu.tolist()
print(json.dumps(out), flush=True)
os._exit(0)
