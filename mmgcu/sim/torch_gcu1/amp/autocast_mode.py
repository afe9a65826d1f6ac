"""Models torch_gcu/amp/autocast_mode.py of a 1.x release: float16 and bfloat16.

The real class drives torch 1.10's GPU autocast state (``set_autocast_gpu_dtype``,
``set_autocast_enabled``), through whose dispatch key torch 1.10 sends XLA tensors. On
torch 2.x XLA tensors have their own autocast key, so the simulator sets that one there.
"""

import torch

_DEVICE_TYPED = hasattr(torch, "get_autocast_dtype")  # torch >= 2.4


def _get_state():
    if _DEVICE_TYPED:
        return torch.is_autocast_enabled("xla"), torch.get_autocast_dtype("xla")
    return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()


def _set_state(enabled: bool, dtype: torch.dtype) -> None:
    if _DEVICE_TYPED:
        torch.set_autocast_enabled("xla", enabled)
        torch.set_autocast_dtype("xla", dtype)
    else:
        torch.set_autocast_enabled(enabled)
        torch.set_autocast_gpu_dtype(dtype)


class autocast:
    """Autocast on the cards: ``enabled``, ``dtype`` (float16 or bfloat16), ``cache_enabled``."""

    def __init__(self, enabled=True, dtype=torch.float16, cache_enabled=True):
        if dtype != torch.float16 and dtype != torch.bfloat16:
            raise RuntimeError(
                f"Current GCU Device does not support {dtype}. "
                "Please switch dtype to float16 && bfloat16."
            )
        self.fast_dtype = dtype
        self._enabled = enabled
        self._cache_enabled = cache_enabled

    def __enter__(self):
        self.prev_cache_enabled = torch.is_autocast_cache_enabled()
        self.prev, self.prev_fastdtype = _get_state()
        _set_state(self._enabled, self.fast_dtype)
        torch.autocast_increment_nesting()
        torch.set_autocast_cache_enabled(self._cache_enabled)

    def __exit__(self, *args):
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        _set_state(self.prev, self.prev_fastdtype)
        torch.set_autocast_cache_enabled(self.prev_cache_enabled)
        return False
