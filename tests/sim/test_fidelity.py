"""The simulated cards behave like devices: placement, training, memory counters, checkpoints."""

import pytest

from tests.conftest import last_json, run_python
from tests.sim.helpers import DEVICE_TYPE, run_sim, sim_json

APIS = ("v2", "legacy")

TRAIN_STEP = """
import copy
import json

import mmgcu.sim
from mmgcu.sim import install

install()
import torch
import torch_gcu

api = mmgcu.sim.state.api
out = {"api": api, "simulated": torch_gcu.__simulated__}
if api == "v2":
    out["device_count"] = torch.gcu.device_count()
    out["same_module"] = torch.gcu is torch_gcu.gcu
    card = torch.device("gcu", 3)
else:
    out["device_count"] = torch_gcu.device_count()
    out["gcu_device_3"] = torch_gcu.gcu_device(3) == torch.device("xla", 3)
    card = torch_gcu.gcu_device(3)

torch.manual_seed(0)
ref = torch.nn.Sequential(
    torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
)
model = copy.deepcopy(ref).to(card)
x = torch.randn(6, 4)
target = torch.randn(6, 2)

def step(net, inputs, labels, opt):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(net(inputs), labels)
    loss.backward()
    opt.step()
    return loss

initial = ref[0].weight.detach().clone().to(card)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
ref_loss = step(ref, x, target, ref_opt).item()
loss = step(model, x.to(card), target.to(card), opt)
out["loss_device"] = str(loss.device)
out["loss_diff"] = abs(loss.item() - ref_loss)
out["param_devices"] = sorted({str(p.device) for p in model.parameters()})
out["grad_devices"] = sorted({str(p.grad.device) for p in model.parameters()})
out["buffer_devices"] = sorted({str(b.device) for b in model.buffers()})
out["state_devices"] = sorted(
    {str(s["momentum_buffer"].device) for s in opt.state.values()}
)
out["n_state"] = len(opt.state)
# Compared on the card: the CPU reference moved onto card 3 for the subtraction.
ref_tensors = list(ref.parameters()) + list(ref.buffers())
card_tensors = list(model.parameters()) + list(model.buffers())
out["max_diff"] = max(
    (c.detach().double() - r.detach().double().to(card)).abs().max().item()
    for c, r in zip(card_tensors, ref_tensors)
)
out["moved"] = (model[0].weight.detach() - initial).abs().sum().item()
out["num_batches_tracked"] = model[1].num_batches_tracked.item()

def error(inputs):
    try:
        model(inputs)
    except RuntimeError as e:
        return str(e)
    return None

out["cpu_input"] = error(torch.randn(6, 4))
out["other_card_input"] = error(torch.randn(6, 4).to(torch.device(card.type, 1)))
out["cuda_available"] = torch.cuda.is_available()
print(json.dumps(out))
"""


@pytest.mark.parametrize("api", APIS)
def test_module_trains_on_card_3(api):
    out = sim_json(TRAIN_STEP, api=api, cards=8)
    card = f"{DEVICE_TYPE[api]}:3"
    assert out["api"] == api and out["simulated"] is True
    assert out["device_count"] == 8
    if api == "v2":
        assert out["same_module"] is True
    else:
        assert out["gcu_device_3"] is True
    assert out["loss_device"] == card
    assert out["param_devices"] == [card]
    assert out["grad_devices"] == [card]
    assert out["buffer_devices"] == [card]
    assert out["n_state"] == 6 and out["state_devices"] == [card]
    # The same step as on the CPU: identical loss, parameters and BatchNorm statistics.
    assert out["loss_diff"] < 1e-6
    assert out["max_diff"] < 1e-6
    assert out["moved"] > 0  # the step changed the weights
    assert out["num_batches_tracked"] == 1
    expected = "Expected all tensors to be on the same device"
    assert out["cpu_input"] is not None and expected in out["cpu_input"]
    assert "cpu" in out["cpu_input"] and card in out["cpu_input"]
    assert out["other_card_input"] is not None and expected in out["other_card_input"]
    assert f"{DEVICE_TYPE[api]}:1" in out["other_card_input"]
    assert out["cuda_available"] is False


MEMORY = """
import json

import mmgcu.sim
from mmgcu.sim import install

install()
import torch

if mmgcu.sim.state.api == "v2":
    mem = torch.gcu
    dtype = "gcu"
else:
    from mmgcu.sim import memory as mem

    dtype = "xla"
card = torch.device(dtype, 3)
out = {}

def snap(name):
    out[name] = {
        "now": mem.memory_allocated(3),
        "peak": mem.max_memory_allocated(3),
        "others": [mem.memory_allocated(i) for i in range(8) if i != 3],
        "other_peaks": [mem.max_memory_allocated(i) for i in range(8) if i != 3],
    }

snap("start")
x = torch.empty(1024, dtype=torch.float32, device=card)
snap("alloc")
views = [x.view(32, 32), x[10:20], x.view(32, 32).t(), x.detach()]
snap("views")
y = x + 1
snap("result")
h = torch.ones(1024, dtype=torch.float16).to(card)
snap("moved")
del h
del y
snap("del_result")
del views
snap("del_views")
del x
snap("del_all")
mem.reset_peak_memory_stats(3)
snap("reset")
z = torch.ones(256, device=torch.device(dtype, 5))
out["card5"] = mem.memory_allocated(5)
out["card3_with_card5"] = mem.memory_allocated(3)
out["by_device_arg"] = mem.memory_allocated(torch.device(dtype, 5))
del z
out["card5_after"] = mem.memory_allocated(5)
print(json.dumps(out))
"""


@pytest.mark.parametrize("api", APIS)
def test_memory_counters_are_true(api):
    out = sim_json(MEMORY, api=api, cards=8)
    zeros = [0] * 7
    for name, snap in out.items():
        if isinstance(snap, dict):
            assert snap["others"] == zeros, name
            assert snap["other_peaks"] == zeros, name
    assert out["start"]["now"] == 0 and out["start"]["peak"] == 0
    assert out["alloc"]["now"] == 4096 and out["alloc"]["peak"] == 4096
    assert out["views"]["now"] == 4096  # views share the storage: counted once
    assert out["result"]["now"] == 8192 and out["result"]["peak"] == 8192
    assert out["moved"]["now"] == 8192 + 2048  # 1024 float16 copied onto the card
    assert out["del_result"]["now"] == 4096
    assert out["del_views"]["now"] == 4096  # x itself is still alive
    assert out["del_all"]["now"] == 0
    assert out["del_all"]["peak"] == 8192 + 2048  # the peak stays until reset
    assert out["reset"] == {"now": 0, "peak": 0, "others": zeros, "other_peaks": zeros}
    assert out["card5"] == 1024 and out["by_device_arg"] == 1024
    assert out["card3_with_card5"] == 0
    assert out["card5_after"] == 0


SAVE = """
import json
import sys

import mmgcu.sim
from mmgcu.sim import install

install()
import torch

card = torch.device("gcu" if mmgcu.sim.state.api == "v2" else "xla", 2)
tensor = (torch.arange(6, dtype=torch.float32) * 1.5).to(card)
param = torch.nn.Parameter(torch.full((3,), 0.5).to(card))
opt = torch.optim.SGD([param], lr=0.1, momentum=0.9)
param.grad = torch.ones(3).to(card)
opt.step()  # param 0.5 - 0.1 * 1 = 0.4; momentum buffer = grad = 1
state = opt.state_dict()
torch.save({"tensor": tensor, "param": param, "optim": state}, sys.argv[1])
print(json.dumps({
    "devices": [str(tensor.device), str(param.device),
                str(state["state"][0]["momentum_buffer"].device)],
    "is_param": isinstance(param, torch.nn.Parameter),
}))
"""

LOAD = """
import json
import sys

import torch

ckpt = torch.load(sys.argv[1], map_location="cpu", weights_only=False)
tensor, param = ckpt["tensor"], ckpt["param"]
buf = ckpt["optim"]["state"][0]["momentum_buffer"]
safe = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
print(json.dumps({
    "types": [type(t).__name__ for t in (tensor, param, buf)],
    "plain": [type(t) in (torch.Tensor, torch.nn.Parameter) for t in (tensor, param, buf)],
    "devices": [str(t.device) for t in (tensor, param, buf)],
    "tensor": torch.equal(tensor, torch.arange(6, dtype=torch.float32) * 1.5),
    "param": torch.allclose(param.detach(), torch.full((3,), 0.4)),
    "param_requires_grad": param.requires_grad,
    "buf": torch.equal(buf, torch.ones(3)),
    "param_groups": ckpt["optim"]["param_groups"][0]["momentum"],
    "safe": torch.equal(safe["tensor"], tensor) and torch.equal(
        safe["optim"]["state"][0]["momentum_buffer"], buf),
    "leaked": sorted(m for m in ("torch_gcu", "mmgcu", "mmgcu.sim") if m in sys.modules),
}))
"""


def _load_without_simulator(path):
    proc = run_python(f"import sys\nsys.argv[1:] = [{str(path)!r}]\n" + LOAD)
    return last_json(proc.stdout)


def _save_on_card(api, path):
    code = f"import sys\nsys.argv[1:] = [{str(path)!r}]\n" + SAVE
    return sim_json(code, api=api, cards=4)


@pytest.mark.parametrize("api", APIS)
def test_checkpoint_loads_without_simulator(api, tmp_path):
    path = tmp_path / "ckpt.pth"
    saved = _save_on_card(api, path)
    assert saved["devices"] == [f"{DEVICE_TYPE[api]}:2"] * 3
    assert saved["is_param"] is True
    loaded = _load_without_simulator(path)
    assert loaded["plain"] == [True, True, True], loaded["types"]
    assert loaded["devices"] == ["cpu"] * 3
    assert loaded["tensor"] and loaded["param"] and loaded["buf"]
    assert loaded["param_requires_grad"] is True
    assert loaded["param_groups"] == 0.9
    assert loaded["safe"] is True  # weights_only loading needs no simulator class either
    assert loaded["leaked"] == []


def test_checkpoint_keeps_parameter_type(tmp_path):
    path = tmp_path / "ckpt.pth"
    _save_on_card("v2", path)
    assert _load_without_simulator(path)["types"][1] == "Parameter"


TO_CPU = """
import json

import mmgcu.sim
from mmgcu.sim import install

install()
import torch

dtype = "gcu" if mmgcu.sim.state.api == "v2" else "xla"
x = torch.arange(3, dtype=torch.float32).to(torch.device(dtype, 3))
out = {}
for name, move in (
    ("cpu", lambda: x.cpu()),
    ("to_cpu", lambda: x.to("cpu")),
    ("to_other_card", lambda: x.to(torch.device(dtype, 1))),
):
    try:
        moved = move()
        out[name] = [str(moved.device), type(moved).__name__, moved.sum().item()]
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


@pytest.mark.parametrize("api", APIS)
def test_card_tensor_moves_back_to_cpu(api):
    # Regression: _to_copy with a device kwarg once raised "got multiple values for 'device'".
    out = sim_json(TO_CPU, api=api, cards=8)
    other = f"{DEVICE_TYPE[api]}:1"
    assert out == {
        "cpu": ["cpu", "Tensor", 3.0],
        "to_cpu": ["cpu", "Tensor", 3.0],
        "to_other_card": [other, "Tensor", 3.0],
    }


def test_torch_manual_seed():
    # Regression: torch.manual_seed -> torch.gcu.manual_seed_all -> torch.manual_seed recursed.
    out = sim_json(
        """
        import json
        from mmgcu.sim import install

        install()
        import torch

        torch.manual_seed(7)
        a = torch.randn(3, device="gcu:0").sum().item()
        torch.gcu.manual_seed(7)
        b = torch.randn(3, device="gcu:0").sum().item()
        torch.manual_seed(8)
        c = torch.randn(3, device="gcu:0").sum().item()
        print(json.dumps({"a": a, "b": b, "c": c}))
        """,
        api="v2",
        cards=2,
    )
    assert out["a"] == out["b"] != out["c"]


@pytest.mark.parametrize("make", ["empty", "to"])
def test_tensor_on_missing_card_is_refused(make):
    proc = run_sim(
        f"""
        from mmgcu.sim import install

        install()
        import torch

        if {make!r} == "empty":
            torch.empty(1, device="gcu:5")
        else:
            torch.ones(1).to("gcu:5")
        """,
        api="v2",
        cards=3,
        check=False,
    )
    assert proc.returncode != 0
    assert "invalid" in proc.stderr


def test_resize_and_out_on_card():
    out = sim_json(
        """
        import json
        from mmgcu.sim import install

        install()
        import torch

        x = torch.empty(0, device="gcu:1")
        x.resize_(1024)
        a = torch.ones(4, device="gcu:1")
        o = torch.empty(0, device="gcu:1")
        torch.add(a, a, out=o)
        print(json.dumps({
            "resized": list(x.shape),
            "out": list(o.shape),
            "bytes": torch.gcu.memory_allocated(1),
        }))
        """,
        api="v2",
        cards=2,
    )
    assert out["resized"] == [1024]
    assert out["out"] == [4]
    assert out["bytes"] == 1024 * 4 + 4 * 4 + 4 * 4
