"""torch_gcu 2.x: PyTorch's PrivateUse1 backend renamed ``gcu``; cards are ``gcu:N``.

With ``gcu2_amp.py`` the only module of the device layer allowed torch APIs newer than
1.10 (``torch.autocast(device_type)``, ``torch.amp.GradScaler``); the delegation it shares
with CUDA (``device_module.py``) runs on torch 1.10 too. torch_gcu 2.x registers
``torch.gcu`` (the device module) and the ``eccl`` backend of torch.distributed for
``gcu`` tensors only, so the default group is ``cpu:gloo,gcu:eccl``.
"""

import torch

from ..errors import GCUError
from .base import simulated
from .device_module import DeviceModuleAccelerator


class GCU2Accelerator(DeviceModuleAccelerator):
    kind = "gcu2"
    device_type = "gcu"
    is_gcu = True
    # A bare 'eccl' group carries only gcu tensors; mmengine sends CPU tensors too.
    default_pg_backend = "cpu:gloo,gcu:eccl"
    amp_dtypes = (torch.float16, torch.bfloat16)

    def __init__(self, torch_gcu):
        super().__init__(torch.gcu)
        self.simulated = simulated(torch_gcu)
        version = getattr(torch_gcu, "__version__", "unknown")
        self.description = f"torch_gcu {version} (2.x, PrivateUse1 'gcu')"

    def check_collectives(self) -> None:
        import torch.distributed as dist

        check = getattr(dist, "is_eccl_available", None)
        if check is None or not check():
            raise GCUError(
                "ECCL is not available: torch_gcu is imported but torch.distributed has no "
                "'eccl' backend. Install the ECCL package of your TopsRider release "
                "(it provides torch.distributed.is_eccl_available())."
            )

    def ddp_kwargs(self, card: int):
        # The torch_gcu 2.x README builds DDP with device_ids=[local_rank].
        return dict(device_ids=[card], output_device=card)

    def autocast(self, dtype=torch.float16, enabled=True):
        if dtype not in self.amp_dtypes:
            raise GCUError(f"GCU autocast supports {self.amp_dtypes}, not {dtype}")
        return torch.autocast("gcu", dtype=dtype, enabled=enabled)

    overflow_steps = ("skip", "zero")

    def grad_scaler(self, overflow_step=None, **kwargs):
        if self._overflow_step(overflow_step) == "zero":
            from .gcu2_amp import ZeroStepGradScaler  # torch >= 2.3: imported on a 2.x stack

            return ZeroStepGradScaler("gcu", **kwargs)
        return torch.amp.GradScaler("gcu", **kwargs)
