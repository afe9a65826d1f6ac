"""The simulated ECCLs' wire: gloo, on the cards' host memory.

Both generations' ECCL run their collectives through a ``ProcessGroupGloo``. A small sum
goes as an all-gather and a local sum in rank order (the same result on every rank, as an
all-reduce gives): gloo's ring all-reduce takes twice the steps of its all-gather, and
with more simulated cards than host cores every step waits for the scheduler. 8 ranks on
2 cores, 129 floats between small matmuls: 18 against 11.5 ms a call (29 against 19
CPU-ms). SyncBN's per-channel sums are that small, and a rehearsal makes two a layer.
How the host moves the bytes is the simulator's own business: what a rank sees (the sum,
in place, on every rank) is ECCL's all-reduce.
"""

from typing import List

import torch

#: Up to this many gathered elements (the tensor's times the world size) a sum is an
#: all-gather, as in :class:`mmgcu.device.base.CardGroup` for CPU tensors on gloo.
GATHER_LIMIT = 1 << 15


def gathered_sum(gloo, tensors: List[torch.Tensor]) -> bool:
    """Sum ``tensors`` (host aliases of card tensors, in place) over ``gloo``'s world by an
    all-gather when that is the cheaper way; False, with nothing sent, when it is not."""
    if len(tensors) != 1:
        return False
    tensor = tensors[0]
    world_size = gloo.size()
    if (
        tensor.dtype == torch.bool  # gloo's own all-reduce decides (torch 1.10's refuses it)
        or not tensor.is_contiguous()
        or tensor.numel() * world_size > GATHER_LIMIT
    ):
        return False
    parts = [torch.empty_like(tensor) for _ in range(world_size)]
    gloo.allgather([parts], [tensor]).wait()
    with torch.no_grad():
        tensor.copy_(torch.stack(parts).sum(0))
    return True
