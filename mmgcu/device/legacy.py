"""torch_gcu 1.x (the T20 stack, torch 1.10): XLA lazy tensors; cards are ``xla:N``.

Only torch 1.10 APIs here. What public material does not confirm is marked ASSUMED.
"""

from typing import Optional

import torch

from .base import DeviceBackend, GCUError


class GcuLegacyBackend(DeviceBackend):
    name = "legacy"
    device_type = "xla"
    is_gcu = True
    supports_sync_bn = False
    sync_bn_reason = "torch_gcu 1.x has no SyncBatchNorm kernel for XLA devices"
    # ASSUMED: legacy ECCL carries only card tensors, so mmengine's CPU collectives get
    # a gloo default group and card tensors (DDP) a separate ECCL group.
    default_group_backend = "gloo"
    device_group_backend = "eccl"
    amp_dtypes = (torch.float16,)
    lazy_step = True

    def __init__(self, torch_gcu):
        self.torch_gcu = torch_gcu
        version = getattr(torch_gcu, "__version__", "unknown")
        self.description = f"torch_gcu {version} (1.x, XLA 'xla')"

    def is_available(self) -> bool:
        return bool(self.torch_gcu.is_available())

    def device_count(self) -> int:
        return int(self.torch_gcu.device_count())

    def current_device(self) -> int:
        return int(self.torch_gcu.current_device())

    def set_device(self, index: int) -> None:
        self.torch_gcu.set_device(index)

    def device(self, index: Optional[int] = None) -> torch.device:
        if index is None:
            index = self.current_device()
        return torch.device(self.torch_gcu.gcu_device(index))

    def device_name(self, index: int = 0) -> str:
        get = getattr(self.torch_gcu, "get_device_name", None)
        return str(get(index)) if get else "GCU"

    def synchronize(self) -> None:
        # ASSUMED: sync_lived_tensor flushes the lazy graph of the current card.
        sync = getattr(self.torch_gcu, "sync_lived_tensor", None)
        if sync is not None:
            sync(self.device())

    # ASSUMED: 1.x may lack memory statistics; report them only where they exist.
    def memory_allocated(self, index: Optional[int] = None) -> Optional[int]:
        fn = getattr(self.torch_gcu, "memory_allocated", None)
        return None if fn is None else int(fn(index))

    def max_memory_allocated(self, index: Optional[int] = None) -> Optional[int]:
        fn = getattr(self.torch_gcu, "max_memory_allocated", None)
        return None if fn is None else int(fn(index))

    def reset_peak_memory_stats(self, index: Optional[int] = None) -> None:
        fn = getattr(self.torch_gcu, "reset_peak_memory_stats", None)
        if fn is not None:
            fn(index)

    def empty_cache(self) -> None:
        fn = getattr(self.torch_gcu, "empty_cache", None)
        if fn is not None:
            fn()

    def manual_seed_all(self, seed: int) -> None:
        self.torch_gcu.manual_seed_all(seed)

    def import_distributed(self):
        # Importing it registers 'eccl' with torch.distributed (ASSUMED: shared state).
        try:
            import torch_gcu.distributed as gcu_dist  # noqa: F401
        except ImportError as e:
            raise GCUError(
                f"ECCL is not available: 'import torch_gcu.distributed' failed ({e}). "
                "Reinstall torch_gcu from your TopsRider release."
            ) from e
        import torch.distributed as dist

        return dist

    def check_dist_backend(self) -> None:
        self.import_distributed()

    def ddp_class(self):
        return self.torch_gcu.nn.parallel.DistributedDataParallel

    def ddp_device_kwargs(self, index: int):
        # torch 1.10 DDP scatters inputs with torch.cuda streams when given device_ids.
        return {}

    def autocast(self, dtype=torch.float16, enabled=True):
        if dtype not in self.amp_dtypes:
            raise GCUError(
                f"torch_gcu 1.x autocast supports only float16, not {dtype}; "
                "use optim_wrapper.dtype='float16'"
            )
        return self.torch_gcu.amp.autocast(enabled=enabled, dtype=dtype)

    def grad_scaler(self, **kwargs):
        return self.torch_gcu.amp.GradScaler(use_zero_grad=True, **kwargs)

    def optimizer_step(self, optimizer, tensors=(), model=None, **kwargs) -> None:
        mode = self.torch_gcu.JitRunMode.SAFEASYNC
        self.torch_gcu.optimizer_step(optimizer, list(tensors), mode=mode, model=model, **kwargs)
