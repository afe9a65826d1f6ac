"""out= arguments on card 0: written in the card tensor's own memory, grown, restrided, and
the results of ops held in card memory that is counted (either generation)."""

import json
import warnings

import sim_alone  # noqa: F401

import mmgcu.sim
from mmgcu.sim import install

install()
import torch  # noqa: E402

warnings.simplefilter("ignore")  # "An output with one or more elements was resized"
card = torch.device("gcu" if mmgcu.sim.state.api == "gcu2" else "xla", 0)
counted = mmgcu.sim.state.ext.memory_allocated
x = torch.arange(6.0, device=card)
out = {"start": counted(0)}
result = x * 2  # a new result: 24 bytes more on the card
out["result"] = [result.device.type, counted(0) - out["start"], result.cpu().tolist()]
big = torch.zeros(2, 6, device=card)
r = torch.add(x, 1, out=big[1])  # into a view: the row of `big` is written
out["into_view"] = [r.data_ptr() == big[1].data_ptr(), big.cpu().tolist()]
grown = torch.empty(0, device=card)
torch.add(x, x, out=grown)
out["grown"] = [list(grown.shape), grown.device.type, grown.cpu().tolist()]
same = torch.empty(2, 3, device=card)  # restrided within its memory
torch.mul(x, 3, out=same)
out["restrided"] = [list(same.shape), list(same.stride()), same.cpu().tolist()]
print(json.dumps(out))
