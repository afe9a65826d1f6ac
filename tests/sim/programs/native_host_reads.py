"""tests/sim/test_native.py's program: host reads on simulated cards (see native_setup)."""

import threading

import torch
import torch.nn.functional as F
from native_setup import finish, install

ext, KIND, D0, D1 = install()

t = torch.tensor([1.5], device=D0)
m = torch.ones(2, 3, device=D0)
reads = {}


def record(name):
    reads[name] = ext.host_reads()


ext.reset_host_reads()
record("start")
# Work that stays on the card reads nothing back.
y = F.conv2d(torch.ones(1, 1, 4, 4, device=D0), torch.ones(1, 1, 3, 3, device=D0))
z = (m @ m.t()).relu_().sum()
torch.ones(3).to(D0).to(D1)
alias = ext.host_alias(m)
alias.add_(1)
record("card_work")
t.item()
record("item")
float(t)
record("float")
bool(t)
record("bool")
int(torch.tensor(3, device=D0))
record("int")
m.cpu()
record("cpu")
m.to("cpu")
record("to_cpu")
m.tolist()
record("tolist")
m.cpu().numpy()
record("numpy")
torch.empty(2, 3).copy_(m)
record("copy_")

# The counters are shared by every thread and lose no count.
ext.reset_host_reads()


def reader():
    for _ in range(200):
        t.item()


threads = [threading.Thread(target=reader) for _ in range(4)]
for th in threads:
    th.start()
for th in threads:
    th.join()
record("threads")
ext.reset_host_reads()
record("reset")
finish(reads)
