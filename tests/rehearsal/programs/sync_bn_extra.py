"""What GCUSyncBatchNorm's synchronised path holds over plain BatchNorm, measured on a
simulated card: one layer, forward and backward, for a float32 and a float16 input. Run
with MMGCU_SIMULATE=t20:1; prints ``{dtype: [extra bytes measured, input bytes]}``."""

import json

import torch

import mmgcu  # noqa: F401  (installs the simulator)
from mmgcu import sim
from mmgcu.model.sync_bn import GCUSyncBatchNorm


class TwoRanks:
    """A card group of two ranks whose all-reduce doubles (this rank's sums, twice)."""

    world_size = 2

    def all_reduce(self, tensor):
        tensor.mul_(2)


def peak_of(world: int, dtype: torch.dtype) -> int:
    card = torch.device("xla", 0)
    layer = GCUSyncBatchNorm(32).to(card).train()
    layer.card_group = TwoRanks() if world > 1 else None
    x = torch.randn(2, 32, 64, 64, device=card, dtype=dtype).requires_grad_()
    grad = torch.randn(2, 32, 64, 64, device=card, dtype=dtype)
    before = sim.state.ext.memory_allocated(0)
    sim.state.ext.reset_peak(0)
    layer(x).backward(grad)
    return int(sim.state.ext.max_memory_allocated(0) - before), x.numel() * x.element_size()


sim.state.ext.set_device(0)
out = {}
for dtype in (torch.float32, torch.float16):
    plain, size = peak_of(1, dtype)
    synced, _ = peak_of(2, dtype)
    out[str(dtype).replace("torch.", "")] = [synced - plain, size]
print(json.dumps(out))
