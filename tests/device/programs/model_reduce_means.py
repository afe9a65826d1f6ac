"""One rank of N on simulated T20 cards: model code that all-reduces card tensors itself.

mmseg's ``EMAModule`` (EMANet) all-reduces its bases with torch.distributed in training
(``reduce_mean`` of ``ema_head.py``), as mmdet's ``reduce_mean`` does in Mask2Former's and
MaskFormer's losses (run too where mmdet is installed). Each runs on this rank's card and
on the CPU from the same seed; the card's results must have the CPU's bytes and its
all-reduces must have gone to ECCL. Run as the ranks of ``routed_collectives.py`` are.
Prints one JSON line.
"""

import json

import torch
import torch.distributed as dist

import mmgcu  # noqa: F401  (installs the simulated torch_gcu)
from mmgcu.device import select_accelerator
from mmgcu.runtime.dist import init_distributed


def ema_bases(device):
    """EMAModule's bases after one training forward pass on ``device``."""
    from mmseg.models.decode_heads.ema_head import EMAModule

    torch.manual_seed(0)
    module = EMAModule(channels=8, num_bases=4, num_stages=2, momentum=0.1).to(device)
    module.train()
    torch.manual_seed(1 + dist.get_rank())
    feats = torch.randn(2, 8, 5, 5).to(device)
    module(feats)
    return module.bases


def mmdet_reduce_mean(device):
    from mmdet.utils import reduce_mean

    return reduce_mean(torch.tensor([float(dist.get_rank() + 1), 7.0]).to(device))


def same_bytes(cpu, card) -> bool:
    card = card.detach().cpu()
    cpu = cpu.detach()
    return (cpu.dtype, cpu.shape) == (card.dtype, card.shape) and (
        cpu.numpy().tobytes() == card.numpy().tobytes()
    )


def main() -> None:
    accelerator = select_accelerator("gcu1")
    card = accelerator.device(init_distributed(accelerator, "pytorch", timeout=120))
    world = dist.group.WORLD
    out = {"rank": dist.get_rank()}
    for name, run in (("EMAModule", ema_bases), ("mmdet reduce_mean", mmdet_reduce_mean)):
        try:
            cpu = run(torch.device("cpu"))
        except ImportError as e:
            out[name] = f"not importable: {e}"
            continue
        before = world.counts["all_reduce eccl"]
        on_card = run(card)
        out[name] = [str(on_card.device), same_bytes(cpu, on_card)]
        out[f"{name} all_reduce eccl"] = world.counts["all_reduce eccl"] - before
    print(json.dumps(out), flush=True)
    dist.barrier()
    accelerator.torch_gcu.distributed.destroy_process_group()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
