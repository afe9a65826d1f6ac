"""``DeviceModuleAccelerator``: an accelerator whose cards a ``torch.cuda``-like module drives.

CUDA (``torch.cuda``, :mod:`mmgcu.device.fallback`) and torch_gcu 2.x (``torch.gcu``,
:mod:`mmgcu.device.gcu2`) share this delegation, so it uses only torch 1.10 APIs: the
CUDA fallback runs on the T20 stack too.
"""

from typing import Optional

from .base import Accelerator


class DeviceModuleAccelerator(Accelerator):
    """An accelerator whose cards are driven by a ``torch.cuda``-like module.

    Args:
        module: the device module (``torch.cuda``, ``torch.gcu``).
    """

    caches_memory = True

    def __init__(self, module):
        super().__init__()
        self.module = module

    def is_available(self) -> bool:
        return bool(self.module.is_available())

    def device_count(self) -> int:
        return int(self.module.device_count())

    def current_device(self) -> int:
        return int(self.module.current_device())

    def set_device(self, index: int) -> None:
        self.module.set_device(index)

    def device_name(self, index: int = 0) -> str:
        return str(self.module.get_device_name(index))

    def peak_memory(self, index: int) -> Optional[int]:
        peak = int(self.module.max_memory_allocated(index))
        self.module.reset_peak_memory_stats(index)
        return peak

    @property
    def memory_source(self) -> str:
        return "peak allocated since the last log line (max_memory_allocated)"

    def empty_cache(self) -> bool:
        self.module.empty_cache()
        return True

    def manual_seed_all(self, seed: int) -> None:
        self.module.manual_seed_all(seed)
