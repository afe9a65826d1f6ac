"""The device layer: the one place mmgcu talks to torch_gcu.

:func:`select_accelerator` builds the :class:`Accelerator` of the device found at run time
(torch_gcu 2.x, then 1.x, then CUDA, then the CPU) or of the kind a config names. It keeps
no state: ``GCURunner`` calls it once and hands the accelerator to what it builds.
"""

import importlib
from typing import Optional, Tuple

import torch

from ..errors import GCUError
from .base import Accelerator, CardGroup, step_seed
from .cards import (
    GENERATION_ALIASES,
    count_cards,
    parse_efsmi,
    physical_card,
    visible_devices,
)
from .device_module import DeviceModuleAccelerator
from .fallback import CPUAccelerator, CUDAAccelerator

__all__ = [
    "Accelerator",
    "CardGroup",
    "DEVICES",
    "DeviceModuleAccelerator",
    "GCUError",
    "count_cards",
    "parse_efsmi",
    "physical_card",
    "select_accelerator",
    "step_seed",
    "visible_devices",
]

#: Values of ``env_cfg.device``: 'auto' detects; 'gcu' demands either GCU generation.
DEVICES = ("auto", "gcu", "gcu2", "gcu1", "cuda", "cpu")
#: Other names users type for the two torch_gcu generations.
ALIASES = GENERATION_ALIASES
_WANTED = {"gcu": "a GCU", "gcu2": "torch_gcu 2.x", "gcu1": "torch_gcu 1.x"}


def _import_torch_gcu() -> Tuple[Optional[object], str]:
    """torch_gcu, or None and why not (a broken install is reported, not hidden)."""
    try:
        return importlib.import_module("torch_gcu"), ""
    except ImportError as e:
        return None, f"torch_gcu is not importable ({e})"
    except Exception as e:  # a driver or ABI failure inside torch_gcu's own import
        return None, f"importing torch_gcu failed: {type(e).__name__}: {e}"


def _gcu_accelerator(torch_gcu, jit_mode) -> Optional[Accelerator]:
    if hasattr(torch, "gcu"):  # 2.x registers torch.gcu
        from .gcu2 import GCU2Accelerator

        return GCU2Accelerator(torch_gcu)
    if hasattr(torch_gcu, "gcu_device"):  # 1.x maps cards to xla:N
        from .gcu1 import GCU1Accelerator

        return GCU1Accelerator(torch_gcu, jit_mode)
    return None


def _fallback(why: str) -> Accelerator:
    accelerator = CUDAAccelerator() if torch.cuda.is_available() else CPUAccelerator()
    accelerator.description = f"{why}; {accelerator.description}"
    return accelerator


def select_accelerator(device: str = "auto", jit_mode: Optional[str] = None) -> Accelerator:
    """The accelerator for ``env_cfg.device`` (one of :data:`DEVICES` or an alias)."""
    kind = ALIASES.get(device, device)
    if kind not in DEVICES:
        raise GCUError(
            f"env_cfg.device={device!r} is not a known device; use one of "
            f"{DEVICES} (or {', '.join(ALIASES)})"
        )
    if kind == "cpu":
        return CPUAccelerator()
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise GCUError("env_cfg.device='cuda' but torch.cuda.is_available() is False")
        return CUDAAccelerator()
    torch_gcu, why = _import_torch_gcu()
    found = _gcu_accelerator(torch_gcu, jit_mode) if torch_gcu is not None else None
    if found is None and torch_gcu is not None:
        why = "torch_gcu was imported but is neither 2.x (torch.gcu) nor 1.x (gcu_device)"
    if kind == "auto":
        return found if found is not None else _fallback(why)
    if found is None:
        raise GCUError(
            f"the config demands {_WANTED[kind]} (env_cfg.device={device!r}) but {why}. "
            "Install torch_gcu from your TopsRider release, or set env_cfg.device='auto' "
            "to run on CUDA/CPU."
        )
    if kind != "gcu" and found.kind != kind:
        raise GCUError(
            f"the config demands {_WANTED[kind]} (env_cfg.device={device!r}) but the "
            f"installed torch_gcu is {found.description}; set env_cfg.device='auto'"
        )
    return found
