"""The torch_gcu 2.x surface: PrivateUse1 renamed ``gcu``, ``torch.gcu``, ECCL for ``gcu``."""

import sys
import types

import torch

from . import eccl, kernels, memory

_MEMORY_API = (
    "is_available device_count current_device set_device synchronize memory_allocated "
    "max_memory_allocated reset_peak_memory_stats empty_cache mem_get_info memory_stats "
    "get_device_name manual_seed manual_seed_all"
).split()


def _amp_module() -> types.ModuleType:
    amp = types.ModuleType("torch_gcu.gcu.amp")

    def autocast(enabled=True, dtype=torch.float16, cache_enabled=True):
        return torch.autocast("gcu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    class GradScaler(torch.amp.GradScaler):
        def __init__(self, *args, **kwargs):
            super().__init__("gcu", *args, **kwargs)

    amp.autocast = autocast
    amp.GradScaler = GradScaler
    return amp


def build() -> types.ModuleType:
    """Install the v2 flavour in this process and return the ``torch_gcu`` module."""
    torch.utils.rename_privateuse1_backend("gcu")
    kernels.register("PrivateUse1")

    gcu = types.ModuleType("torch_gcu.gcu")
    for name in _MEMORY_API:
        setattr(gcu, name, getattr(memory, name))
    gcu._is_in_bad_fork = lambda: False
    gcu.is_initialized = lambda: True
    gcu.is_bf16_supported = lambda: True
    gcu.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    gcu.amp = _amp_module()
    torch._register_device_module("gcu", gcu)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=False)

    from . import eccl_installed

    if eccl_installed():
        eccl.register("gcu")
    # torch_gcu 2.x adds this to torch.distributed; the simulator does what it does.
    torch.distributed.is_eccl_available = eccl_installed

    mod = types.ModuleType("torch_gcu")
    mod.__version__ = f"{torch.__version__.split('+')[0]}+sim"
    mod.__simulated__ = True
    mod.gcu = gcu
    for name in ("gcu", "gcu.amp"):
        sys.modules[f"torch_gcu.{name}"] = eval(name, {"gcu": gcu})  # noqa: S307
    return mod
