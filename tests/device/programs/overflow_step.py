"""An overflowed AMP step on the simulated card, in each mode the accelerator offers.

Run with ``MMGCU_SIMULATE=1`` and ``MMGCU_SIMULATE_API=gcu2|gcu1``. For each of the
accelerator's ``overflow_steps``: a Linear layer on the card, SGD with momentum, one finite
AMP step and then one whose gradient holds an inf, each through the accelerator's
GradScaler; the card reads of ``scaler.step`` + ``update`` (the simulator's counter), the
weights and momentum buffers after each step, and the loss scale. Prints one JSON line.
"""

import json

import torch

import mmgcu  # noqa: F401  (installs the simulated torch_gcu)
from mmgcu.device import GCUError, select_accelerator
from mmgcu.sim import state

accelerator = select_accelerator("gcu")
accelerator.set_device(0)
device = accelerator.device()


def values(t):
    return t.detach().cpu().flatten().tolist()


def amp_step(model, optimizer, scaler, overflow):
    optimizer.zero_grad()
    with accelerator.autocast(torch.float16):
        y = model(torch.linspace(-1, 1, 8 * 4).view(8, 4).to(device))
    loss = y.float().pow(2).mean()
    scaler.scale(loss).backward()
    if overflow:
        model.weight.grad[0, 0] = float("inf")  # a write on the card: no read
    before = state.host_reads()
    scaler.step(optimizer)
    scaler.update()
    accelerator.after_amp_step(optimizer, model, scaler, loss.detach())
    reads = state.host_reads() - before
    momentum = optimizer.state[model.weight]["momentum_buffer"]
    return dict(reads=reads, weight=values(model.weight), momentum=values(momentum))


out = {"kind": accelerator.kind, "modes": {}}
for mode in accelerator.overflow_steps:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = accelerator.grad_scaler(mode, init_scale=1024.0)
    finite = amp_step(model, optimizer, scaler, overflow=False)
    scale = scaler.get_scale()
    overflowed = amp_step(model, optimizer, scaler, overflow=True)
    out["modes"][mode] = dict(
        scaler=type(scaler).__name__,
        finite=finite,
        overflowed=overflowed,
        scales=[scale, scaler.get_scale()],
    )
refused = [m for m in ("skip", "zero") if m not in accelerator.overflow_steps]
try:
    accelerator.grad_scaler(refused[0] if refused else "bogus")
    out["refused"] = None
except GCUError as e:
    out["refused"] = str(e)
print(json.dumps(out))
