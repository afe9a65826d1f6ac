"""GCUOptimWrapper and GCUAmpOptimWrapper bound to the simulated torch_gcu 1.x on card 1.

Run with ``MMGCU_SIMULATE=2 MMGCU_SIMULATE_API=gcu1``. Each wrapper makes four updates with
``accumulative_counts=2``, each iteration ended as GCURuntimeInfoHook ends it
(``finish_step``); the counters of the simulated torch_gcu show which vendor calls were
made and which graphs ran. Prints what it found as one JSON line.
"""

import json

import torch

from mmgcu import GCUAmpOptimWrapper, GCUOptimWrapper, select_accelerator
from mmgcu.binding import Binding
from mmgcu.sim import graph, state
from tests.fakes import ToyModel, toy_batch

accelerator = select_accelerator("gcu1")
accelerator.set_device(1)
out = {}


def train(wrapper_class, **kwargs):
    torch.manual_seed(0)
    model = ToyModel().to(accelerator.device())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    wrapper = wrapper_class(optimizer=optimizer, accumulative_counts=2, **kwargs)
    wrapper.bind(Binding(accelerator, model))
    dtypes = []
    model.linear.register_forward_hook(
        lambda module, args, output: dtypes.append(str(output.dtype))
    )
    before = model.linear.weight.detach().cpu().clone()
    state.counters.clear()
    graphs = graph.counters()
    for _ in range(4):
        with wrapper.optim_context(model):
            data = model.data_preprocessor(toy_batch(), training=True)
            losses = model(**data, mode="loss")
        loss, _ = model.parse_losses(losses)
        wrapper.update_params(loss)
        accelerator.finish_step()
    result = {
        "counters": dict(state.counters),
        "graph_runs": {
            k: v - graphs[k] for k, v in graph.counters().items() if k.startswith("runs.")
        },
        "moved": not torch.equal(before, model.linear.weight.detach().cpu()),
        "forward_dtypes": sorted(set(dtypes)),
    }
    saved = wrapper.state_dict()
    fresh = wrapper_class(
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), **kwargs
    )
    fresh.bind(Binding(accelerator, model))
    fresh.load_state_dict(dict(saved))
    reloaded = fresh.state_dict()
    result["round_trip"] = {
        "keys": sorted(saved),
        "same_state": all(
            torch.equal(a["momentum_buffer"], b["momentum_buffer"])
            for a, b in zip(saved["state"].values(), reloaded["state"].values())
        ),
        "scaler": [saved.get("loss_scaler"), reloaded.get("loss_scaler")],
    }
    if hasattr(wrapper, "loss_scaler"):
        scaler = type(wrapper.loss_scaler)
        result["scaler"] = f"{scaler.__module__}.{scaler.__name__}"
    return result


out["plain"] = train(GCUOptimWrapper)
out["amp"] = train(GCUAmpOptimWrapper, loss_scale=512.0)
print(json.dumps(out))
