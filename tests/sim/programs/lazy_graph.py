"""The simulated XLA card's lazy graph: what runs a graph, what compiles one, what falls back.

Run with ``MMGCU_SIMULATE=t20:1`` (and ``MMGCU_SIM_XLA`` as the test asks). Each case
measures the card's counters around a few ops and prints everything as one JSON line; the
cases mirror what a real XLA runtime does with the same code (torch_xla's semantics: see
``mmgcu/sim/csrc/lazy_graph.h``; ``tests/conformance`` checks them against torch_xla).
"""

import json
import threading

import torch
import torch.nn.functional as F

import mmgcu  # installs the simulator
from mmgcu.sim import graph, state

torch_gcu = __import__("torch_gcu")
card = torch_gcu.gcu_device(0)
out = {}


def counted(fn):
    """Runs, compiles, cached compiles and fallbacks of ``fn()``."""
    before = graph.counters()
    fn()
    after = graph.counters()
    diff = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    runs = sum(v for k, v in diff.items() if k.startswith("runs."))
    fallbacks = {k: v for k, v in diff.items() if k.startswith("aten::")}
    return [runs, diff.get("UncachedCompile", 0), diff.get("CachedCompile", 0), fallbacks]


x = torch.randn(4, 4).to(card)  # data: uploading runs nothing
out["upload"] = counted(lambda: torch.randn(4, 4).to(card))


def read_twice():
    a = x * 2
    b = a + 1
    a.cpu()  # a graph; a is data from now on
    a.cpu()  # a transfer
    b.cpu()  # b's graph computes a again


out["reads"] = counted(read_twice)


def item_twice():
    s = x.sum()
    s.item()  # a fallback (aten::_local_scalar_dense): s keeps its IR
    s.item()  # so its graph runs again (and is found compiled)


out["items"] = counted(item_twice)


def mask_index():
    m = x > 0
    y = x[m]  # nonzero on the mask: its graph runs, on the CPU the indices
    y.sum().cpu()  # a graph of the masked values' shape


out["mask_index"] = counted(mask_index)


def scalars(value):
    return counted(lambda: (x * value).cpu())


# A Python scalar is uploaded as data, so 3.5 and 4.5 (and 2.0) make one graph; 0 and +-1
# are constants of the graph, so 1.0 makes another.
out["scalars"] = [scalars(3.5), scalars(4.5), scalars(1.0), scalars(2.0)]
# A 0-dim host tensor holding 0 or +-1 arrives as a constant (pending: reading it runs a
# graph); any other value arrives as data.
zero, two = torch.tensor(0.0).to(card), torch.tensor(2.0).to(card)
out["constant_upload"] = [counted(lambda: zero.cpu())[0], counted(lambda: two.cpu())[0]]


def step_of_listed():
    a, b = x * 3, x * 4
    torch_gcu.unlazy([a])  # a graph whose output is a: b stays pending
    pending = state.ext.graph_pending(0)
    torch_gcu.sync_lived_tensor(0)  # every live pending value: b
    return pending, state.ext.graph_pending(0), (a, b)


holder = {}
out["step"] = counted(lambda: holder.update(result=step_of_listed()[:2]))
out["step_pending"] = holder["result"]


def partial_write():
    base = torch.zeros(4, 4).to(card)
    torch_gcu.sync_lived_tensor(0)
    base[0].add_(1)  # through a view: the storage's value is pending again
    pending = state.ext.graph_pending(0)
    base.cpu()
    return pending


out["partial_write"] = counted(lambda: holder.update(pending=partial_write()))
out["partial_pending"] = holder["pending"]


def same_graph_twice():
    (x * 5 + 3).cpu()
    (x * 5 + 3).cpu()


out["cache"] = counted(same_graph_twice)
torch_gcu.clear_graph_caches()
out["cache_cleared"] = counted(lambda: (x * 5 + 3).cpu())


def empty_index(side):
    y = torch.randn(side, side).to(card)
    return counted(lambda: torch.histc(y[y > 100].float(), bins=4, min=0, max=3).cpu())


# a mask that selects nothing: the same graph for every size on torch_xla 2.9, not on 1.10
out["empty_index"] = [empty_index(4), empty_index(5)]

# where: the Python line that made a cut; on autograd's thread, "backward"
start = graph.counters()["events"]
(x * 7).cpu()
out["caller"] = next((e["caller"] for e in graph.events(start)), None)  # None: no graph kept


def backward_fallback():
    t = torch.randn(2, 3, 8, 8).to(card).requires_grad_(True)
    F.interpolate(t, size=(16, 16), mode="bilinear", align_corners=False).sum().backward()


start = graph.counters()["events"]
out["backward"] = counted(backward_fallback)
out["backward_callers"] = sorted({e["caller"] for e in graph.events(start) if e["cause"] != "step"})


def adaptive(size):
    return counted(lambda: F.adaptive_avg_pool2d(torch.randn(1, 2, 8, 8).to(card), size).cpu())


out["adaptive"] = [adaptive(4), adaptive(3)]  # 8 % 3: no XLA lowering for that shape

# ops torch_xla lowers whole although torch has composite kernels for them, and roll, which
# torch_xla 1.10 (the T20 profile) does not lower, with 2.9 (xla-cpu) does
y = torch.randn(2, 3, 4).to(card)
out["whole"] = {
    "repeat": counted(lambda: y.repeat(2, 1, 1).cpu()),
    "tile": counted(lambda: y.tile(2).cpu()),
    "mv": counted(lambda: y[0].t().mv(y[0, :, 0]).cpu()),
    "roll": counted(lambda: y.roll(1, 2).cpu()),
}

# from another thread too (the runs of all threads are the process's)
thread = threading.Thread(target=lambda: (x * 9).cpu())
out["thread"] = counted(lambda: (thread.start(), thread.join()))
out["report"] = torch_gcu.metrics_report()
out["compiled"] = [
    mmgcu.select_accelerator("gcu1").compiled_graphs(),
    graph.counters()["UncachedCompile"],
]
print(json.dumps(out))
