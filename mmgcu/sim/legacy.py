"""The torch_gcu 1.x surface: XLA devices (``xla:N``), the lazy-step API, torch_gcu.distributed.

What the public material shows of torch_gcu 1.x is modelled; where it is silent the
simulator picks the strictest reading and says so (see the comments).
"""

import enum
import sys
import types

import torch
import torch.distributed as dist

from . import eccl, kernels, memory, state


class JitRunMode(enum.Enum):
    SYNC = 0
    ASYNC = 1
    SAFEASYNC = 2


def gcu_device(index=None) -> torch.device:
    index = state.current_card() if index is None else state.check_card(index)
    return torch.device("xla", index)


def optimizer_step(optimizer, tensors=None, mode=JitRunMode.ASYNC, model=None, **kwargs):
    """Run the lazy graph and the optimizer step (recorded, so tests can count it)."""
    state.calls["optimizer_step"] += 1
    return optimizer.step(**kwargs)


def unlazy(tensors):
    state.calls["unlazy"] += 1


def sync_lived_tensor(device=None):
    state.calls["sync_lived_tensor"] += 1


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """torch_gcu 1.x DDP, assumed a torch DDP subclass.

    Assumption: on torch 1.10, ``device_ids`` makes DDP scatter inputs with
    ``torch.cuda`` streams, which an XLA device does not have; the simulator refuses it.
    """

    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        if device_ids is not None or output_device is not None:
            raise ValueError(
                "torch_gcu 1.x DistributedDataParallel takes no device_ids/output_device "
                f"(got device_ids={device_ids}, output_device={output_device})"
            )
        super().__init__(module, **kwargs)


def _amp_module() -> types.ModuleType:
    amp = types.ModuleType("torch_gcu.amp")

    def autocast(enabled=True, dtype=torch.float16, cache_enabled=True):
        return torch.autocast("xla", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    class GradScaler(torch.amp.GradScaler):
        def __init__(self, *args, use_zero_grad=True, **kwargs):
            super().__init__("xla", *args, **kwargs)
            self.use_zero_grad = use_zero_grad

    amp.autocast = autocast
    amp.GradScaler = GradScaler
    return amp


def _distributed_module() -> types.ModuleType:
    # Assumption: torch_gcu.distributed shares torch.distributed's state (not confirmed);
    # its ECCL is modelled as carrying only device tensors.
    mod = types.ModuleType("torch_gcu.distributed")
    for name in dir(dist):
        if not name.startswith("_"):
            setattr(mod, name, getattr(dist, name))
    mod.is_eccl_available = lambda: True
    return mod


def _register_serialization() -> None:
    # Like torch_xla: name xla storages 'xla:N' in checkpoints. map_location='cpu' then
    # loads them anywhere, this package or not.
    def tag(storage):
        if storage.device.type == "xla":
            return f"xla:{storage.device.index}"
        return None

    def restore(storage, location):
        if location.startswith("xla"):
            return storage.to(torch.device(location))
        return None

    torch.serialization.register_package(99, tag, restore)


def build() -> types.ModuleType:
    """Install the legacy flavour in this process and return the ``torch_gcu`` module."""
    from . import eccl_installed

    kernels.register("XLA")
    _register_serialization()
    if eccl_installed():
        eccl.register("xla")

    mod = types.ModuleType("torch_gcu")
    mod.__version__ = "1.10.0+sim"
    mod.__simulated__ = True
    for name in (
        "is_available device_count current_device set_device get_device_name "
        "manual_seed manual_seed_all synchronize"
    ).split():
        setattr(mod, name, getattr(memory, name))
    mod.gcu_device = gcu_device
    mod.JitRunMode = JitRunMode
    mod.optimizer_step = optimizer_step
    mod.unlazy = unlazy
    mod.sync_lived_tensor = sync_lived_tensor
    mod.amp = _amp_module()
    mod.distributed = _distributed_module() if eccl_installed() else None
    mod.nn = types.ModuleType("torch_gcu.nn")
    mod.nn.parallel = types.ModuleType("torch_gcu.nn.parallel")
    mod.nn.parallel.DistributedDataParallel = DistributedDataParallel
    for name, sub in (
        ("amp", mod.amp),
        ("distributed", mod.distributed),
        ("nn", mod.nn),
        ("nn.parallel", mod.nn.parallel),
    ):
        if sub is not None:  # a missing ECCL: 'import torch_gcu.distributed' fails
            sys.modules[f"torch_gcu.{name}"] = sub
    return mod
