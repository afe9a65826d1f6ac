"""One rank of GCUSyncBatchNorm on a simulated card, over the accelerator's card group.

Run as each of 2 ranks (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT and MMGCU_SIMULATE*
set): the process groups are made by the accelerator as GCURunner makes them, and the layer
is checked against BatchNorm on the CPU over both ranks' batches. Prints one JSON line.
"""

import datetime
import json
import os

import torch

import mmgcu  # (installs the simulated torch_gcu)
from mmgcu.device import CardGroup, select_accelerator
from mmgcu.model.sync_bn import GCUSyncBatchNorm

BATCHES = [1, 3]


class Recording(CardGroup):
    """The accelerator's card group, recording the device of each all-reduce."""

    def __init__(self, group: CardGroup):
        super().__init__(group.dist, group.group, group.name)
        self.calls = []

    def all_reduce(self, tensor):
        self.calls.append(str(tensor.device))
        super().all_reduce(tensor)


def rel_err(a, b):
    a, b = a.detach().cpu().double(), b.detach().double()
    return ((a - b).abs() / (b.abs() + b.abs().max())).max().item()


def main() -> None:
    rank = int(os.environ["RANK"])
    accelerator = select_accelerator("gcu")
    accelerator.set_device(rank)
    timeout = datetime.timedelta(seconds=60)
    backend = accelerator.default_pg_backend
    group = Recording(accelerator.init_process_groups(backend, timeout=timeout))
    card = accelerator.device(rank)
    ref = torch.nn.BatchNorm2d(4)
    layer = GCUSyncBatchNorm(4, card_group=group).to(card)
    lo, hi = sum(BATCHES[:rank]), sum(BATCHES[: rank + 1])
    err, host_reads = 0.0, 0
    for step in range(2):
        g = torch.Generator().manual_seed(step)
        xs = torch.randn(sum(BATCHES), 4, 5, 5, generator=g) * 2 + 1
        gy = torch.randn(sum(BATCHES), 4, 5, 5, generator=g)
        x_ref = xs.clone().requires_grad_()
        y_ref = ref(x_ref)
        y_ref.backward(gy)
        x = xs[lo:hi].to(card).requires_grad_()
        dy = gy[lo:hi].to(card)
        reads = mmgcu.sim.state.host_reads()
        y = layer(x)
        y.backward(dy)
        host_reads += mmgcu.sim.state.host_reads() - reads
        calls = len(group.calls)
        weight_grad = layer.weight.grad.clone()
        group.all_reduce(weight_grad)  # the sum over ranks of the local weight gradients
        del group.calls[calls:]
        err = max(
            err,
            rel_err(y, y_ref[lo:hi]),
            rel_err(x.grad, x_ref.grad[lo:hi]),
            rel_err(weight_grad, ref.weight.grad),
            rel_err(layer.running_var, ref.running_var),
        )
        layer.weight.grad = ref.weight.grad = None
    out = {"err": err, "calls": group.calls, "device": str(y.device), "host_reads": host_reads}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
