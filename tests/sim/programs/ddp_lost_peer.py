"""One rank of two under the simulated torch_gcu 1.x DDP: rank 1 stops after one step.

Run as rank RANK of WORLD_SIZE=2 (MASTER_* set) with MMGCU_SIMULATE=2 and
MMGCU_SIMULATE_API=gcu1. Rank 0's next backward pass reduces the gradients with a peer that
is gone; it prints, as one JSON line, the exception that reached ``backward()``'s caller.
"""

import json
import os

import sim_alone  # noqa: F401

from mmgcu.sim import install

torch_gcu = install()
import torch  # noqa: E402

rank = int(os.environ["RANK"])
torch_gcu.set_device(rank)
torch_gcu.distributed.init_process_group("eccl")
card = torch_gcu.gcu_device(rank)
model = torch.nn.Linear(3, 1).to(card)
ddp = torch_gcu.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
ddp(torch.ones(2, 3)).sum().backward()  # both ranks: a step in sync
torch_gcu.distributed.barrier()
if rank == 1:
    print(json.dumps({"rank": 1, "stopped": True}), flush=True)
    os._exit(0)  # gone without a word, as a killed rank
out = {"rank": 0}
try:
    ddp(torch.ones(2, 3)).sum().backward()
    out["error"] = None
except BaseException as e:  # noqa: BLE001 (what reaches the caller is the finding)
    out["error"] = [type(e).__name__, str(e)]
print(json.dumps(out), flush=True)
os._exit(0)
