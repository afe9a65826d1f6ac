"""No torch_gcu: CUDA where it exists, else the CPU, so one config runs anywhere."""

from typing import Optional

import torch

from .base import DeviceBackend


class CudaBackend(DeviceBackend):
    name = "cuda"
    device_type = "cuda"
    supports_sync_bn = True
    default_group_backend = "nccl"
    amp_dtypes = (torch.float16, torch.bfloat16)
    description = "no torch_gcu; CUDA found"

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def set_device(self, index: int) -> None:
        torch.cuda.set_device(index)

    def device_name(self, index: int = 0) -> str:
        return torch.cuda.get_device_name(index)

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def memory_allocated(self, index: Optional[int] = None) -> Optional[int]:
        return torch.cuda.memory_allocated(index)

    def max_memory_allocated(self, index: Optional[int] = None) -> Optional[int]:
        return torch.cuda.max_memory_allocated(index)

    def reset_peak_memory_stats(self, index: Optional[int] = None) -> None:
        torch.cuda.reset_peak_memory_stats(index)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def manual_seed_all(self, seed: int) -> None:
        torch.cuda.manual_seed_all(seed)

    def ddp_device_kwargs(self, index: int):
        return dict(device_ids=[index], output_device=index)

    def autocast(self, dtype=torch.float16, enabled=True):
        return torch.cuda.amp.autocast(enabled=enabled, dtype=dtype)

    def grad_scaler(self, **kwargs):
        return torch.cuda.amp.GradScaler(**kwargs)


class CpuBackend(DeviceBackend):
    """One process per host: every 'card' is the CPU."""

    name = "cpu"
    device_type = "cpu"
    supports_sync_bn = False
    sync_bn_reason = "SyncBatchNorm has no CPU implementation"
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
