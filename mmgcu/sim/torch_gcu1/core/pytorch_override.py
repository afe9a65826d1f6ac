"""Models torch_gcu/core/pytorch_override.py of a 1.x release: what importing torch_gcu
changes in torch itself.

- ``Tensor.is_gcu()``.
- Loading a card tensor: torch pickles an ``xla`` tensor through numpy with its device
  string ('xla:0'); torch_gcu rebuilds it on the card only when that string is the current
  card, otherwise on the CPU. ``map_location`` does not apply to this path, and a process
  without torch_gcu cannot rebuild it at all.
"""

import torch
import torch._utils


def is_gcu(self) -> bool:
    return self.device.type == "xla"


def _rebuild_device_tensor_from_numpy_gcu(data, dtype, device, requires_grad):
    if device.startswith("xla"):
        from .device import current_device

        tensor = torch.from_numpy(data).to(dtype=dtype)
        if device == f"xla:{current_device()}":
            tensor = tensor.to(device)
    else:
        tensor = torch.from_numpy(data).to(dtype=dtype, device=device)
    tensor.requires_grad = requires_grad
    return tensor


# torch 1.10 pickles the rebuild function by name: under its real module name a checkpoint
# opens only where torch_gcu is importable, as a real 1.x checkpoint does.
_rebuild_device_tensor_from_numpy_gcu.__module__ = "torch_gcu.core.pytorch_override"


def install() -> None:
    torch.Tensor.is_gcu = is_gcu
    torch._utils._rebuild_device_tensor_from_numpy = _rebuild_device_tensor_from_numpy_gcu
