"""What every device backend offers the rest of mmgcu.

The runner, wrapper, hooks and tools talk to a :class:`DeviceBackend` and never to
torch_gcu; each torch_gcu generation (and the CUDA/CPU fallback) is one subclass.
"""

from typing import Any, Dict, Optional, Type

import torch


class GCUError(RuntimeError):
    """A launch or set-up mistake mmgcu stops on, with a message that names the fix."""


class DeviceBackend:
    """The device operations mmgcu needs, for one kind of device.

    Attributes:
        name: the generation: ``'v2'``, ``'legacy'``, ``'cuda'`` or ``'cpu'``.
        device_type: the ``torch.device`` type of a card (``'gcu'``, ``'xla'``, ...).
        is_gcu: whether the cards are Enflame GCUs.
        supports_sync_bn: whether SyncBatchNorm runs on this device.
        description: one line saying what was found (logged, and printed by ``mmgcu env``).
    """

    name = "base"
    device_type = "cpu"
    is_gcu = False
    supports_sync_bn = False
    sync_bn_reason = ""
    description = ""

    # -- cards -----------------------------------------------------------------
    def is_available(self) -> bool:
        raise NotImplementedError

    def device_count(self) -> int:
        raise NotImplementedError

    def current_device(self) -> int:
        raise NotImplementedError

    def set_device(self, index: int) -> None:
        raise NotImplementedError

    def device(self, index: Optional[int] = None) -> torch.device:
        """The ``torch.device`` of card ``index`` (default: the current card)."""
        if index is None:
            index = self.current_device()
        return torch.device(self.device_type, index)

    def device_name(self, index: int = 0) -> str:
        return self.device_type

    def synchronize(self) -> None:
        """Wait for the card's queued work."""

    # -- memory: None where the generation cannot tell ---------------------------
    def memory_allocated(self, index: Optional[int] = None) -> Optional[int]:
        return None

    def max_memory_allocated(self, index: Optional[int] = None) -> Optional[int]:
        return None

    def reset_peak_memory_stats(self, index: Optional[int] = None) -> None:
        """Start a new peak-memory window."""

    def empty_cache(self) -> None:
        """Give cached, unused card memory back."""

    # -- randomness --------------------------------------------------------------
    def manual_seed_all(self, seed: int) -> None:
        """Seed every card's generator (torch.manual_seed already seeds the CPU)."""

    # -- distribution ------------------------------------------------------------
    #: ``init_process_group`` backend of the default group; it must carry CPU tensors
    #: too, because mmengine's own collectives send CPU tensors for unknown backends.
    default_group_backend = "gloo"
    #: backend of a separate group for card tensors, or None when the default group
    #: carries them as well.
    device_group_backend: Optional[str] = None

    def check_dist_backend(self) -> None:
        """Raise :class:`GCUError` when the card collectives are not available."""

    def import_distributed(self):
        """The ``torch.distributed``-like module whose ``init_process_group`` to call."""
        import torch.distributed as dist

        return dist

    def ddp_class(self) -> Type[torch.nn.Module]:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel

    def ddp_device_kwargs(self, index: int) -> Dict[str, Any]:
        """The device arguments this generation's DDP needs for card ``index``."""
        return {}

    # -- precision ---------------------------------------------------------------
    amp_dtypes = ()

    def autocast(self, dtype: torch.dtype = torch.float16, enabled: bool = True):
        raise GCUError(f"mixed precision is not available on {self.name} ({self.description})")

    def grad_scaler(self, **kwargs):
        raise GCUError(f"a GradScaler is not available on {self.name} ({self.description})")

    # -- the step ----------------------------------------------------------------
    #: True where the optimizer step must go through the vendor's lazy-graph call.
    lazy_step = False

    def optimizer_step(self, optimizer, tensors=(), model=None, **kwargs) -> None:
        """Step ``optimizer``; a lazy-graph generation also runs the graph here."""
        optimizer.step(**kwargs)

    # -- reporting ---------------------------------------------------------------
    def facts(self) -> Dict[str, Any]:
        """What this backend found, for logs and ``mmgcu env``."""
        return {
            "generation": self.name,
            "device_type": self.device_type,
            "description": self.description,
            "available": self.is_available(),
            "cards": self.device_count() if self.is_available() else 0,
            "dist_backend": self.default_group_backend
            + (f" + {self.device_group_backend}" if self.device_group_backend else ""),
        }
