"""Models torch_gcu/core/debug.py of a 1.x release: the only memory figure is
``get_hbm_alloc_size`` (bytes allocated on a card now). 1.x has no ``memory_allocated``,
``max_memory_allocated``, ``reset_peak_memory_stats`` or ``empty_cache``.
``metrics_report()`` returns the lazy graph's metrics and counters as text (its format is
not public: torch_xla 1.x's, which torch_gcu 1.x forks, is taken)."""

from ... import graph, state
from .device import _check_device_valid, _device_t, _get_device_index

__all__ = ["dump_hbm_alloc_info", "get_hbm_alloc_size", "metrics_report"]


def metrics_report() -> str:
    """The full metrics and counters report (compiles, graph runs, CPU fallbacks)."""
    return graph.metrics_report()


def get_hbm_alloc_size(device: _device_t = None) -> int:
    index = _get_device_index(device, True)
    _check_device_valid(index)
    return int(state.ext.memory_allocated(index))


def dump_hbm_alloc_info(device: _device_t = None) -> None:
    index = _get_device_index(device, True)
    _check_device_valid(index)
    print(f"card {index}: {get_hbm_alloc_size(index)} bytes allocated (simulated)")
