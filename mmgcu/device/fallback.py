"""No torch_gcu: CUDA where it exists, else the CPU, so one config runs anywhere."""

from typing import Optional

import torch

from .base import Accelerator
from .device_module import DeviceModuleAccelerator


class CUDAAccelerator(DeviceModuleAccelerator):
    kind = "cuda"
    device_type = "cuda"
    default_pg_backend = "nccl"
    amp_dtypes = (torch.float16, torch.bfloat16)
    description = "no torch_gcu; CUDA found"
    cudnn = True
    torch_sync_bn = True

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
