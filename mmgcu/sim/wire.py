"""The simulated ECCLs' wire: gloo, on the cards' host memory.

Both generations' ECCL run their collectives through a ``ProcessGroupGloo``. A sum of up
to :data:`GATHER_LIMIT` gathered elements goes to rank 0, which adds the parts in rank
order and broadcasts the result (the same bytes on every rank, as ECCL's all-reduce gives).
With more simulated cards than host cores every step of gloo's ring waits for the
scheduler: its all-reduce takes ``2 (n - 1)`` steps and its all-gather ``n - 1``, a gather
and a broadcast two. Measured on 2 cores, ms a call:

=====================  ===========  ==========  ===================
floats, ranks          all-reduce   all-gather  gather + broadcast
=====================  ===========  ==========  ===================
129, 8                 18           11.5        3.3
129, 2                 1.4          0.8         0.5
100000, 8              22           27          8.0
130000, 8              16           21          6.5
100000, 2              1.1          1.9         0.8
500000, 2              3.6          6.2         4.1
=====================  ===========  ==========  ===================

SyncBN's per-channel sums and a small model's gradient buckets are in that range. How the
host moves the bytes is the simulator's own business: what a rank sees (the sum, in place,
on every rank) is ECCL's all-reduce.
"""

from typing import List

import torch
import torch.distributed as dist

#: Up to this many gathered elements (the tensor's times the world size) a sum goes through
#: rank 0; about there gloo's all-reduce catches up (500000 floats on 2 ranks: 3.6 ms
#: against 4.1).
GATHER_LIMIT = 1 << 20


def gathered_sum(gloo, tensors: List[torch.Tensor]) -> bool:
    """Sum ``tensors`` (host aliases of card tensors, in place) over ``gloo``'s world through
    its rank 0 when that is the cheaper way; False, with nothing sent, when it is not."""
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
    root = gloo.rank() == 0
    gather = dist.GatherOptions()
    gather.rootRank = 0
    parts = [torch.empty_like(tensor) for _ in range(world_size)] if root else None
    gloo.gather([parts] if root else [], [tensor], gather).wait()
    if root:
        with torch.no_grad():
            tensor.copy_(torch.stack(parts).sum(0))
    broadcast = dist.BroadcastOptions()
    broadcast.rootRank = 0
    broadcast.rootTensor = 0
    gloo.broadcast([tensor], broadcast).wait()
    return True
