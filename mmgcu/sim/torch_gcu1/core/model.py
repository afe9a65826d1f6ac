"""Models torch_gcu/core/model.py of a 1.x release: the lazy step.

On a real card every op is recorded into a graph that runs when the host asks for it: at
``optimizer_step``, ``unlazy`` or ``sync_lived_tensor`` (or when a value is read). The
simulated card computes eagerly and keeps the graph's account (``mmgcu.sim.graph``): these
functions keep the real signatures and argument checks, run the graph of the values they
are given (``_sync_multi``) or of every live value (``_sync_live_tensors``), and count the
calls (``state.counters``) with what each was given.
"""

import enum

import torch

from ... import state
from .device import _check_device_valid, _device_t, _get_device_index

__all__ = [
    "JitRunMode",
    "synchronize",
    "unlazy",
    "sync_lived_tensor",
    "optimizer_step",
    "collect_buffers",
    "collect_amp_training_params",
    "fetch_gradients",
    "clear_graph_caches",
]


class JitRunMode(enum.Enum):
    """SYNC runs the graph and waits; ASYNC delivers it without waiting (higher memory peak);
    SAFEASYNC waits for the previous graph before delivering this one."""

    SYNC = 0
    ASYNC = 1
    SAFEASYNC = 2


def _assert_type_valid(obj, valid_type) -> None:
    if not isinstance(obj, valid_type):
        raise TypeError(f"Param must be {valid_type}, got {type(obj)}")


def _is_gcu_tensor(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xla"


def _is_gcu_tensor_list_or_tuple(tensors) -> bool:
    return isinstance(tensors, (list, tuple)) and all(_is_gcu_tensor(t) for t in tensors)


def _run_graph(api: str, mode, outputs, device=None) -> None:
    """The graph whose outputs are ``outputs`` (torch_gcu's ``_sync_multi``), or with None
    every live value on ``device`` (``_sync_live_tensors``)."""
    if not isinstance(mode, JitRunMode):
        raise TypeError(f"mode must be a torch_gcu.JitRunMode, got {mode!r}")
    state.counters[api] += 1
    state.counters[f"graph_mode_{mode.name}"] += 1
    state.counters["graph_outputs_all_live"] += outputs is None
    if outputs is None:
        state.ext.graph_sync_live(_get_device_index(device, True))
    else:
        state.ext.graph_sync([t for t in outputs if _is_gcu_tensor(t)])


def synchronize(device: _device_t = None) -> None:
    """Wait for everything queued on the card (a simulated card is always done)."""
    _check_device_valid(_get_device_index(device, True))
    state.counters["synchronize"] += 1


def unlazy(tensors, mode=JitRunMode.SAFEASYNC) -> None:
    """Run a graph whose outputs are ``tensors`` (a list or tuple of card tensors)."""
    if not _is_gcu_tensor_list_or_tuple(tensors):
        raise TypeError("Tensors must be a list of GCU tensor.")
    _run_graph("unlazy", mode, tensors)


def sync_lived_tensor(device: _device_t = None, mode=JitRunMode.SAFEASYNC) -> None:
    """Run a graph of every live tensor on the card; at SAFEASYNC it returns before the
    graph ends (``synchronize`` waits)."""
    index = _get_device_index(device, True)
    _check_device_valid(index)
    _run_graph("sync_lived_tensor", mode, None, index)


def optimizer_step(
    optimizer,
    extra_output=None,
    optimizer_args={},  # noqa: B006 (the 1.x signature)
    model=None,
    mode=JitRunMode.SAFEASYNC,
    device: _device_t = None,
):
    """``optimizer.step(**optimizer_args)``, then the graph run.

    With ``model`` the graph's outputs are the parameters, the optimizer state, the
    model's buffers and ``extra_output``; without it every live tensor on the card is an
    output ("not recommended for performance") and ``device`` names the card.
    """
    _assert_type_valid(optimizer, torch.optim.Optimizer)
    result = optimizer.step(**optimizer_args)
    outputs = None
    if model is not None:
        _assert_type_valid(model, torch.nn.Module)
        outputs = [p for g in optimizer.param_groups for p in g["params"]]
        if _is_gcu_tensor(extra_output):
            outputs.append(extra_output)
        elif _is_gcu_tensor_list_or_tuple(extra_output):
            outputs.extend(extra_output)
        outputs.extend(collect_buffers(model))
    else:
        _check_device_valid(_get_device_index(device, True))
    _run_graph("optimizer_step", mode, outputs, device)
    return result


def collect_buffers(model):
    _assert_type_valid(model, torch.nn.Module)
    return [b.data for b in model.buffers() if isinstance(b, torch.Tensor)]


def collect_amp_training_params(model, optimizer, scaler):
    """The graph outputs of an AMP step: parameters, optimizer state, buffers, the scale."""
    from ..amp.grad_scaler import GradScaler

    _assert_type_valid(model, torch.nn.Module)
    _assert_type_valid(optimizer, torch.optim.Optimizer)
    _assert_type_valid(scaler, GradScaler)
    params = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            params.append(p.data)
            params.extend(v for v in optimizer.state[p].values() if isinstance(v, torch.Tensor))
    params.extend(collect_buffers(model))
    return params + [scaler._scale, scaler._growth_tracker]


def fetch_gradients(optimizer):
    _assert_type_valid(optimizer, torch.optim.Optimizer)
    return [p.grad.data for g in optimizer.param_groups for p in g["params"] if p.grad is not None]


def clear_graph_caches() -> None:
    """Forget every compiled graph: the next run of each compiles it again."""
    state.ext.graph_clear_cache()
