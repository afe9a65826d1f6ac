"""Load the checkpoint ``sys.argv[1]`` in a process without torch_gcu or mmgcu."""

import json
import sys

import torch

path = sys.argv[1]
out = {}
try:
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
except Exception as e:  # a card tensor that cannot be rebuilt here
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
    sys.exit(0)
tensor, param = ckpt["tensor"], ckpt["param"]
buf = ckpt["optim"]["state"][0]["momentum_buffer"]
safe = torch.load(path, map_location="cpu", weights_only=True)
out = {
    "error": None,
    "types": [type(t).__name__ for t in (tensor, param, buf)],
    "plain": [type(t) in (torch.Tensor, torch.nn.Parameter) for t in (tensor, param, buf)],
    "devices": [str(t.device) for t in (tensor, param, buf)],
    "tensor": torch.equal(tensor, torch.arange(6, dtype=torch.float32) * 1.5),
    "param": torch.allclose(param.detach(), torch.full((3,), 0.4)),
    "param_requires_grad": param.requires_grad,
    "buf": torch.equal(buf, torch.ones(3)),
    "momentum": ckpt["optim"]["param_groups"][0]["momentum"],
    "safe": torch.equal(safe["tensor"], tensor)
    and torch.equal(safe["optim"]["state"][0]["momentum_buffer"], buf),
    "leaked": sorted(m for m in ("torch_gcu", "mmgcu", "mmgcu.sim") if m in sys.modules),
}
print(json.dumps(out))
