"""Models torch_gcu/core/debug.py of a 1.x release: the only memory figure is
``get_hbm_alloc_size`` (bytes allocated on a card now). 1.x has no ``memory_allocated``,
``max_memory_allocated``, ``reset_peak_memory_stats`` or ``empty_cache``."""

from ... import state
from .device import _check_device_valid, _device_t, _get_device_index

__all__ = ["dump_hbm_alloc_info", "get_hbm_alloc_size"]


def get_hbm_alloc_size(device: _device_t = None) -> int:
    index = _get_device_index(device, True)
    _check_device_valid(index)
    return int(state.ext.memory_allocated(index))


def dump_hbm_alloc_info(device: _device_t = None) -> None:
    index = _get_device_index(device, True)
    _check_device_valid(index)
    print(f"card {index}: {get_hbm_alloc_size(index)} bytes allocated (simulated)")
