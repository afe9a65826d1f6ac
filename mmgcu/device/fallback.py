"""No torch_gcu: CUDA where it exists, else the CPU, so one config runs anywhere.

``DeviceModuleAccelerator`` is the delegation to a ``torch.cuda``-like device module
that CUDA and torch_gcu 2.x (``torch.gcu``) share.
"""

from typing import Optional

import torch

from .base import Accelerator


class DeviceModuleAccelerator(Accelerator):
    """An accelerator whose cards are driven by a ``torch.cuda``-like module."""

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


class CUDAAccelerator(DeviceModuleAccelerator):
    kind = "cuda"
    device_type = "cuda"
    default_pg_backend = "nccl"
    amp_dtypes = (torch.float16, torch.bfloat16)
    description = "no torch_gcu; CUDA found"

    def __init__(self):
        super().__init__(torch.cuda)

    def ddp_kwargs(self, card: int):
        return dict(device_ids=[card], output_device=card)

    def autocast(self, dtype=torch.float16, enabled=True):
        return torch.cuda.amp.autocast(enabled=enabled, dtype=dtype)

    overflow_steps = ("skip",)

    def grad_scaler(self, overflow_step=None, **kwargs):
        self._overflow_step(overflow_step)
        return torch.cuda.amp.GradScaler(**kwargs)


class CPUAccelerator(Accelerator):
    """One process per host: every 'card' is the CPU."""

    kind = "cpu"
    device_type = "cpu"
    description = "no torch_gcu and no CUDA; running on the CPU"

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def set_device(self, index: int) -> None:
        """The CPU has no cards to choose between."""

    def device(self, index: Optional[int] = None) -> torch.device:
        return torch.device("cpu")
