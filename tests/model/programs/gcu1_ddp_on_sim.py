"""GCU1DistributedDataParallel around the simulated torch_gcu 1.x DDP: one rank on card
``LOCAL_RANK`` of a one-rank world (``RANK=0 WORLD_SIZE=1 MASTER_ADDR MASTER_PORT``), with
``MMGCU_SIMULATE`` and ``MMGCU_SIMULATE_API=gcu1``. Prints what it found as one JSON line.
"""

import json
import os

import torch
from mmengine.model import is_model_wrapper

import mmgcu  # installs the simulated torch_gcu
from mmgcu import GCU1DistributedDataParallel, GCUError, GCUOptimWrapper, select_accelerator
from mmgcu.binding import Binding
from mmgcu.sim import state
from tests.fakes import ToyModel, toy_batch

card = int(os.environ["LOCAL_RANK"])
accelerator = select_accelerator("gcu1")
accelerator.set_device(card)
accelerator.init_process_groups("gloo")
out = {"version": mmgcu.__version__}

try:
    GCU1DistributedDataParallel(ToyModel(), accelerator)
    out["on_cpu"] = None
except GCUError as e:
    out["on_cpu"] = str(e)

model = ToyModel().to(accelerator.device())
wrapper = GCU1DistributedDataParallel(model, accelerator, broadcast_buffers=False)
vendor = wrapper.ddp
out["wrapper"] = {
    "is_model_wrapper": is_model_wrapper(wrapper),
    "module_is_model": wrapper.module is model,
    "vendor": f"{type(vendor).__module__}.{type(vendor).__name__}",
    "device_ids": vendor.device_ids,
    "eccl_group": vendor.process_group is accelerator.card_group.group,
    "broadcast_buffers": vendor.broadcast_buffers,
}

synced = []  # whether the vendor DDP reduces gradients, seen at each forward
model.register_forward_hook(lambda *_: synced.append(vendor.require_backward_grad_sync))
optimizer = torch.optim.SGD(wrapper.parameters(), lr=0.1)
optim_wrapper = GCUOptimWrapper(optimizer=optimizer, accumulative_counts=2)
optim_wrapper.bind(Binding(accelerator, wrapper))
before = model.linear.weight.detach().cpu().clone()
state.counters.clear()
losses = []
for _ in range(4):
    losses.append(wrapper.train_step(toy_batch(), optim_wrapper)["loss"])
    accelerator.finish_step()  # as GCURuntimeInfoHook ends each iteration
out["train"] = {
    "losses": [float(loss.detach()) for loss in losses],
    "graph_runs": state.counters["unlazy"],
    "synced": list(synced),
    "moved": not torch.equal(before, model.linear.weight.detach().cpu()),
}
out["val"] = [str(t.device) for t in wrapper.val_step(toy_batch())]
out["test"] = [str(t.device) for t in wrapper.test_step(toy_batch())]
out["forward"] = str(wrapper(**toy_batch()).device)  # inputs moved to the card by the vendor
print(json.dumps(out))
