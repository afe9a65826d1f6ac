"""The device layer: the one place mmgcu talks to torch_gcu.

:func:`get_backend` returns the backend of the generation found at run time (torch_gcu
2.x, then 1.x, then CUDA, then the CPU), or of the one a config forces; it is cached per
process. Everything else in mmgcu asks the backend, never torch_gcu.
"""

import importlib
import logging
from typing import Optional, Tuple

import torch

from .base import DeviceBackend, GCUError
from .cards import count_cards, parse_efsmi, physical_card, visible_devices
from .fallback import CpuBackend, CudaBackend

__all__ = [
    "DeviceBackend",
    "GCUError",
    "GENERATIONS",
    "count_cards",
    "detect",
    "get_backend",
    "parse_efsmi",
    "physical_card",
    "reset_backend",
    "visible_devices",
]

logger = logging.getLogger(__name__)

#: Values of ``env_cfg.device``: 'auto' detects; 'gcu' demands either GCU generation.
GENERATIONS = ("auto", "gcu", "v2", "legacy", "cuda", "cpu")

_backend: Optional[DeviceBackend] = None


def _import_torch_gcu() -> Tuple[Optional[object], str]:
    """torch_gcu, or None and why not (a broken install is reported, not hidden)."""
    try:
        return importlib.import_module("torch_gcu"), ""
    except ImportError as e:
        return None, f"torch_gcu is not importable ({e})"
    except Exception as e:  # a driver or ABI failure inside torch_gcu's own import
        return None, f"importing torch_gcu failed: {type(e).__name__}: {e}"


def _gcu_backend(torch_gcu) -> Optional[DeviceBackend]:
    if hasattr(torch, "gcu"):  # 2.x registers torch.gcu
        from .v2 import GcuV2Backend

        return GcuV2Backend(torch_gcu)
    if hasattr(torch_gcu, "gcu_device"):  # 1.x maps cards to xla:N
        from .legacy import GcuLegacyBackend

        return GcuLegacyBackend(torch_gcu)
    return None


def detect(generation: str = "auto") -> DeviceBackend:
    """Build the backend for ``generation`` (one of :data:`GENERATIONS`)."""
    if generation not in GENERATIONS:
        raise GCUError(
            f"env_cfg.device={generation!r} is not a known device; use one of {GENERATIONS}"
        )
    if generation == "cpu":
        return CpuBackend()
    if generation == "cuda":
        if not torch.cuda.is_available():
            raise GCUError("env_cfg.device='cuda' but torch.cuda.is_available() is False")
        return CudaBackend()

    torch_gcu, why = _import_torch_gcu()
    backend = _gcu_backend(torch_gcu) if torch_gcu is not None else None
    if backend is None and torch_gcu is not None:
        why = "torch_gcu was imported but is neither 2.x (torch.gcu) nor 1.x (gcu_device)"
    if generation == "auto":
        if backend is not None:
            return backend
        fallback = CudaBackend() if torch.cuda.is_available() else CpuBackend()
        fallback.description = f"{why}; {fallback.description}"
        return fallback
    wanted = {"gcu": "a GCU", "v2": "torch_gcu 2.x", "legacy": "torch_gcu 1.x"}[generation]
    if backend is None:
        raise GCUError(
            f"the config demands {wanted} (env_cfg.device={generation!r}) but {why}. "
            "Install torch_gcu from your TopsRider release, or set env_cfg.device='auto' "
            "to run on CUDA/CPU."
        )
    if generation in ("v2", "legacy") and backend.name != generation:
        raise GCUError(
            f"the config demands {wanted} (env_cfg.device={generation!r}) but the "
            f"installed torch_gcu is {backend.description}; set env_cfg.device='auto'"
        )
    return backend


def get_backend(generation: Optional[str] = None) -> DeviceBackend:
    """The process's backend; the first call (or one naming a generation) chooses it."""
    global _backend
    if _backend is None or (generation is not None and not _matches(_backend, generation)):
        _backend = detect(generation or "auto")
        logger.info("mmgcu device: %s (%s)", _backend.name, _backend.description)
    return _backend


def _matches(backend: DeviceBackend, generation: str) -> bool:
    return (
        generation == "auto"
        or generation == backend.name
        or (generation == "gcu" and backend.is_gcu)
    )


def reset_backend() -> None:
    """Forget the cached backend (tests)."""
    global _backend
    _backend = None
