"""What torch's DDP holds on a simulated torch_gcu 2.x card beyond the model: its buckets,
from its construction, against the bytes of the gradients. Run with MMGCU_SIMULATE=s60:1
and MASTER_PORT set; prints ``{"gradients", "wrap", "after_backward"}`` in bytes."""

import json
import os

import torch
import torch.distributed as dist

import mmgcu  # noqa: F401  (installs the simulator)
from mmgcu import sim

os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
dist.init_process_group("cpu:gloo,gcu:eccl")
torch.gcu.set_device(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024)).to("gcu:0")
before = sim.state.ext.memory_allocated(0)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
wrap = sim.state.ext.memory_allocated(0) - before
ddp(torch.randn(4, 1024, device="gcu:0")).sum().backward()
after = sim.state.ext.memory_allocated(0) - before
grads = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps(dict(gradients=grads, wrap=wrap, after_backward=after)))
dist.destroy_process_group()
