"""An accelerator on the simulated torch_gcu: its card, memory, groups, step and AMP step.

Run with ``MMGCU_SIMULATE=<cards>``, ``MMGCU_SIMULATE_API=gcu2|gcu1`` and the variables of
rank 0 of a one-rank world (``RANK=0 WORLD_SIZE=1 MASTER_ADDR MASTER_PORT``) on card
``LOCAL_RANK``. Prints what it found as one JSON line.
"""

import json
import os

import torch

import mmgcu  # installs the simulated torch_gcu
from mmgcu.device import GCUError, select_accelerator
from mmgcu.sim import graph, state

card = int(os.environ["LOCAL_RANK"])
accelerator = select_accelerator("gcu")
out = {"kind": accelerator.kind, "version": mmgcu.__version__}
out["cards"] = accelerator.device_count()
try:
    accelerator.set_device(accelerator.device_count())
    out["missing_card"] = None
except (GCUError, RuntimeError) as e:  # mmgcu's check (1.x) or the driver's (2.x)
    out["missing_card"] = f"{type(e).__name__}: {e}"
accelerator.set_device(card)
out["current"] = accelerator.current_device()
out["device"] = str(accelerator.device())
out["name"] = accelerator.device_name(card)

block = torch.ones(256, 256, device=accelerator.device())  # 256 KiB
memory = [accelerator.peak_memory(card)]
del block
memory += [accelerator.peak_memory(card), accelerator.peak_memory(card)]
out["memory"] = memory  # with the block, after freeing it, once more
out["empty_cache"] = accelerator.empty_cache()
accelerator.manual_seed_all(2**32 + 7)  # torch_gcu 1.x refuses seeds over 32 bits

accelerator.check_collectives()
group = accelerator.init_process_groups(accelerator.default_pg_backend)
out["group"] = [group.name, group.world_size, group is accelerator.card_group]
tensor = torch.full((3,), 2.0, device=accelerator.device())
group.all_reduce(tensor)
group.broadcast(tensor, 0)
out["reduced"] = [str(tensor.device), tensor.tolist()]
out["summary"] = accelerator.summary()

torch.manual_seed(0)
model = torch.nn.Linear(4, 2).to(accelerator.device())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
before = model.weight.detach().cpu().clone()
loss = model(torch.randn(8, 4, device=accelerator.device())).pow(2).mean()
loss.backward()
state.counters.clear()
graphs = graph.counters()
accelerator.optimizer_step(optimizer, model, loss.detach())
accelerator.finish_step()
out["step"] = dict(state.counters)
out["step_graphs"] = {k: v - graphs[k] for k, v in graph.counters().items() if v != graphs[k]}
out["stepped"] = not torch.equal(before, model.weight.detach().cpu())

scaler = accelerator.grad_scaler()
optimizer.zero_grad()
with accelerator.autocast(torch.float16):
    y = model(torch.randn(8, 4, device=accelerator.device()))
out["amp_dtype"] = str(y.dtype)
loss = y.float().pow(2).mean()
scaler.scale(loss).backward()
state.counters.clear()
before = model.weight.detach().cpu().clone()
scaler.step(optimizer)
scaler.update()
graphs = graph.counters()
accelerator.after_amp_step(optimizer, model, scaler, loss.detach())
accelerator.finish_step()
out["amp_step"] = dict(state.counters)
out["amp_graphs"] = {k: v - graphs[k] for k, v in graph.counters().items() if v != graphs[k]}
out["amp_stepped"] = not torch.equal(before, model.weight.detach().cpu())
print(json.dumps(out))
