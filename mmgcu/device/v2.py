"""torch_gcu 2.x: PyTorch's PrivateUse1 backend renamed ``gcu``; cards are ``gcu:N``.

This is the only module besides ``legacy.py`` that touches torch_gcu, and the only one
allowed torch APIs newer than 1.10 (``torch.autocast(device_type)``, ``torch.amp``).
"""

from typing import Optional

import torch

from .base import DeviceBackend, GCUError


class GcuV2Backend(DeviceBackend):
    name = "v2"
    device_type = "gcu"
    is_gcu = True
    supports_sync_bn = True
    # A bare 'eccl' group carries only gcu tensors; mmengine sends CPU tensors too.
    default_group_backend = "cpu:gloo,gcu:eccl"
    amp_dtypes = (torch.float16, torch.bfloat16)

    def __init__(self, torch_gcu):
        self.torch_gcu = torch_gcu
        self.gcu = torch.gcu  # registered by torch_gcu
        version = getattr(torch_gcu, "__version__", "unknown")
        self.description = f"torch_gcu {version} (2.x, PrivateUse1 'gcu')"

    def is_available(self) -> bool:
        return bool(self.gcu.is_available())

    def device_count(self) -> int:
        return int(self.gcu.device_count())

    def current_device(self) -> int:
        return int(self.gcu.current_device())

    def set_device(self, index: int) -> None:
        self.gcu.set_device(index)

    def device_name(self, index: int = 0) -> str:
        return str(self.gcu.get_device_name(index))

    def synchronize(self) -> None:
        self.gcu.synchronize()

    def memory_allocated(self, index: Optional[int] = None) -> Optional[int]:
        return int(self.gcu.memory_allocated(index))

    def max_memory_allocated(self, index: Optional[int] = None) -> Optional[int]:
        return int(self.gcu.max_memory_allocated(index))

    def reset_peak_memory_stats(self, index: Optional[int] = None) -> None:
        self.gcu.reset_peak_memory_stats(index)

    def empty_cache(self) -> None:
        self.gcu.empty_cache()

    def manual_seed_all(self, seed: int) -> None:
        self.gcu.manual_seed_all(seed)

    def check_dist_backend(self) -> None:
        import torch.distributed as dist

        check = getattr(dist, "is_eccl_available", None)
        if check is None or not check():
            raise GCUError(
                "ECCL is not available: torch_gcu is imported but torch.distributed has no "
                "'eccl' backend. Install the ECCL package of your TopsRider release "
                "(it provides torch.distributed.is_eccl_available())."
            )

    def ddp_device_kwargs(self, index: int):
        # The torch_gcu 2.x README builds DDP with device_ids=[local_rank].
        return dict(device_ids=[index], output_device=index)

    def autocast(self, dtype=torch.float16, enabled=True):
        if dtype not in self.amp_dtypes:
            raise GCUError(f"GCU autocast supports {self.amp_dtypes}, not {dtype}")
        return torch.autocast("gcu", dtype=dtype, enabled=enabled)

    def grad_scaler(self, **kwargs):
        return torch.amp.GradScaler("gcu", **kwargs)
