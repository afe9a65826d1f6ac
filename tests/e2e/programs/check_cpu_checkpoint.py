"""Open a checkpoint in plain torch (no mmgcu, no torch_gcu) and report what it holds.

Usage: check_cpu_checkpoint.py CHECKPOINT. Prints one JSON line: the top-level keys, the
number of tensors, those that are not plain CPU tensors, the optimizer's momentum buffers
and the iteration.
"""

import json
import sys

import torch

kwargs = {} if torch.__version__.startswith("1.") else {"weights_only": False}
ckpt = torch.load(sys.argv[1], map_location="cpu", **kwargs)
bad, seen, count = [], set(), [0]


def walk(x, path):
    if id(x) in seen:
        return
    seen.add(id(x))
    if isinstance(x, torch.Tensor):
        count[0] += 1
        if type(x) not in (torch.Tensor, torch.nn.Parameter) or x.device.type != "cpu":
            bad.append(f"{path}: {type(x).__name__} on {x.device}")
    elif isinstance(x, dict):
        for k, v in x.items():
            walk(v, f"{path}[{k!r}]")
    elif isinstance(x, (list, tuple, set)):
        for i, v in enumerate(x):
            walk(v, f"{path}[{i}]")
    elif hasattr(x, "__dict__"):
        walk(vars(x), f"{path}.__dict__")


walk(ckpt, "ckpt")
momentum = [s for s in ckpt["optimizer"]["state"].values() if "momentum_buffer" in s]
print(
    json.dumps(
        dict(
            keys=sorted(ckpt),
            tensors=count[0],
            bad=bad[:20],
            momentum=len(momentum),
            iter=ckpt["meta"]["iter"],
        )
    )
)
