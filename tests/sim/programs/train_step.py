"""One SGD step of a small model on card 3 against the same step on the CPU, and inputs
from the wrong device. Run with MMGCU_SIMULATE=8 and MMGCU_SIMULATE_API."""

import copy
import json

import sim_alone  # noqa: F401

import mmgcu.sim
from mmgcu.sim import install

install()
import torch  # noqa: E402
import torch_gcu  # noqa: E402

api = mmgcu.sim.state.api
out = {"api": api, "simulated": torch_gcu.__simulated__}
if api == "gcu2":
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
out["state_devices"] = sorted({str(s["momentum_buffer"].device) for s in opt.state.values()})
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
