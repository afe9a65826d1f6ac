"""``torch.gcu`` (also ``torch_gcu.gcu``) of torch_gcu 2.x: the device module PyTorch
reaches through ``torch._register_device_module``, a ``torch.cuda`` look-alike."""

import torch

from . import amp  # noqa: F401
from .device import (  # noqa: F401
    current_device,
    device_count,
    empty_cache,
    get_device_name,
    is_available,
    manual_seed,
    manual_seed_all,
    max_memory_allocated,
    mem_get_info,
    memory_allocated,
    memory_stats,
    reset_peak_memory_stats,
    set_device,
    synchronize,
)


def _is_in_bad_fork() -> bool:
    return False


def is_initialized() -> bool:
    return True


def is_bf16_supported() -> bool:
    return True


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]
