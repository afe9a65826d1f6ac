"""One rank of two: an all_reduce on the cards, then exit without destroy_process_group
(stock tools/train.py never calls it). Run with MMGCU_SIMULATE=2 (torch_gcu 2.x)."""

import json
import os

import sim_alone  # noqa: F401

from mmgcu.sim import install

install()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

rank = int(os.environ["RANK"])
dist.init_process_group("cpu:gloo,gcu:eccl")
card = torch.ones(3, device=f"gcu:{rank}")
dist.all_reduce(card)
print(json.dumps({"sum": card.tolist()}))
