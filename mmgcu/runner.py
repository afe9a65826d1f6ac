"""``GCURunner``: mmengine's Runner, placed on GCU cards.

Selected by ``runner_type='GCURunner'`` (``configs/_base_/gcu_runtime.py`` sets it), so
the stock ``tools/train.py`` of mmsegmentation runs unchanged. It overrides where stock
mmengine assumes CUDA: the distributed set-up (``setup_env``), the model placement
(``wrap_model``), seeding, and the building of components that are CUDA-only in mmengine
(``GCU_COUNTERPARTS``). It adds a one-time placement check and atomic checkpoint writes;
everything else is mmengine's.
"""

import contextlib
import copy
import logging
import os
import os.path as osp
import time

import torch
from mmengine.dist import is_distributed, master_only
from mmengine.logging import print_log
from mmengine.model import (
    MMDistributedDataParallel,
    convert_sync_batchnorm,
    is_model_wrapper,
    revert_sync_batchnorm,
)
from mmengine.registry import MODEL_WRAPPERS, RUNNERS
from mmengine.runner import Runner

from .device import GCUError, get_backend
from .dist import device_group, init_distributed, lost_peer
from .hooks import GCUDevicePlacementHook
from .model import GCUDistributedDataParallel

# Wrapper types (names or classes) a stock or seed config names. On every device they mean
# GCUDistributedDataParallel, which places the model on the rank's card first.
_STOCK_DDP = (
    "MMDistributedDataParallel",
    "DistributedDataParallel",
    MMDistributedDataParallel,
    torch.nn.parallel.DistributedDataParallel,
)

# Stock components that assume CUDA, and their GCU counterparts. On a GCU, a config (or
# a stock flag such as tools/train.py --amp) naming the left one gets the right one.
GCU_COUNTERPARTS = {
    "OptimWrapper": "GCUOptimWrapper",
    "AmpOptimWrapper": "GCUAmpOptimWrapper",
    "ValLoop": "GCUValLoop",
    "TestLoop": "GCUTestLoop",
    "LogProcessor": "GCULogProcessor",
    "EmptyCacheHook": "GCUEmptyCacheHook",
}


def _gcu_counterpart(cfg, default=None):
    """``cfg`` (a dict) with its stock ``type`` replaced by the GCU counterpart."""
    if not isinstance(cfg, dict):
        return cfg
    name = cfg.get("type", default)
    if name in GCU_COUNTERPARTS:
        cfg = copy.copy(cfg)
        cfg["type"] = GCU_COUNTERPARTS[name]
    return cfg


def _has_sync_bn(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules()) or any(
        type(m).__name__ == "SyncBatchNorm" for m in model.modules()
    )


@contextlib.contextmanager
def _full_unpickling():
    """torch.load as before torch 2.6 (no-op there), for the duration of the block."""
    name = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
    previous = os.environ.get(name)
    os.environ[name] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[name]
        else:
            os.environ[name] = previous


def _batch_devices(data):
    if isinstance(data, torch.Tensor):
        return {data.device}
    if isinstance(data, dict):
        data = list(data.values())
    if isinstance(data, (list, tuple)):
        return set().union(*(_batch_devices(d) for d in data)) if data else set()
    return set()


def _check_first_batch(model: torch.nn.Module, device: torch.device) -> None:
    """Check, once, that the data preprocessor puts the batch on the card.

    A custom preprocessor that leaves the batch on the CPU would otherwise fail deep
    inside the first convolution. The hook removes itself after the first batch.
    """
    preprocessor = getattr(model, "data_preprocessor", None)
    if not isinstance(preprocessor, torch.nn.Module):
        return

    def check(module, inputs, output):
        handle.remove()
        wrong = sorted(str(d) for d in _batch_devices(output) if d != device)
        if wrong:
            raise GCUError(
                f"the data preprocessor ({type(module).__name__}) returned a batch on "
                f"{', '.join(wrong)}, but the model is on {device}. Move the batch with "
                "BaseDataPreprocessor.cast_data (or self.device) in its forward; mmengine's "
                "preprocessors do this when they are not overridden."
            )

    handle = preprocessor.register_forward_hook(check)


@RUNNERS.register_module()
class GCURunner(Runner):
    """A :class:`mmengine.runner.Runner` that trains on this rank's GCU card.

    Config keys it reads besides mmengine's:

    - ``env_cfg.device``: ``'auto'`` (default: torch_gcu 2.x, then 1.x, then CUDA, then
      CPU), ``'gcu'`` (either GCU generation, or stop), ``'v2'``, ``'legacy'``,
      ``'cuda'`` or ``'cpu'``.
    - ``env_cfg.dist_cfg.backend``: left out, ``'eccl'`` or ``'nccl'`` all mean the
      device's backend; ``'gloo'`` is refused on torch_gcu 2.x (it cannot carry card
      tensors) and is the default group on 1.x (card tensors have an ECCL group).
    - ``gcu_placement_check``: ``False`` to drop :class:`GCUDevicePlacementHook`.
    """

    # Seconds a rank whose collective lost a peer waits before it exits (see _casualty).
    peer_loss_grace_s = 10.0

    def setup_env(self, env_cfg: dict) -> None:
        """Choose the device, set this rank's card, then create the process group."""
        self.device_backend = get_backend(env_cfg.get("device", "auto"))
        backend = self.device_backend
        if self.distributed and not is_distributed():
            dist_cfg = dict(env_cfg.get("dist_cfg", {}))
            self.card = init_distributed(
                backend, self.launcher, dist_cfg.pop("backend", None), **dist_cfg
            )
        elif self.distributed:  # the caller created the group
            self.card = backend.current_device()
        else:
            self.card = 0
            backend.set_device(0)
        if env_cfg.get("cudnn_benchmark") and backend.name != "cuda":
            env_cfg = {k: v for k, v in env_cfg.items() if k != "cudnn_benchmark"}
        # The rest is mmengine's: multiprocessing, timestamp broadcast, rlimit.
        super().setup_env(env_cfg)

    def _log_env(self, env_cfg: dict) -> None:
        super()._log_env(env_cfg)
        backend = self.device_backend
        self.logger.info(
            "mmgcu: rank %d of %d on %s (generation %s: %s), process group %s",
            self.rank,
            self.world_size,
            backend.device(self.card),
            backend.name,
            backend.description,
            torch.distributed.get_backend() if is_distributed() else "none",
        )

    def wrap_model(self, model_wrapper_cfg, model):
        """Move the model to this rank's card, then wrap it for the card's DDP."""
        if is_model_wrapper(model):
            return super().wrap_model(model_wrapper_cfg, model)
        backend = self.device_backend
        model = model.to(backend.device(self.card))
        _check_first_batch(model, backend.device(self.card))
        if not self.distributed:
            return revert_sync_batchnorm(model)

        sync_bn = self.cfg.get("sync_bn", None)
        if backend.supports_sync_bn:
            if sync_bn is not None:
                model = convert_sync_batchnorm(model, sync_bn)
        elif sync_bn is not None or _has_sync_bn(model):
            print_log(
                f"SyncBatchNorm is reverted to BatchNorm on {backend.name}: "
                f"{backend.sync_bn_reason}. Each rank normalises with its own batch.",
                logger="current",
                level=logging.WARNING,
            )
            model = revert_sync_batchnorm(model)

        cfg = copy.deepcopy(model_wrapper_cfg) if model_wrapper_cfg else {}
        for key in ("device_ids", "output_device"):
            given = cfg.pop(key, None)
            if given is not None:  # one config serves every rank: no value fits them all
                raise GCUError(
                    f"model_wrapper_cfg.{key}={given}, but each rank trains on its own card "
                    f"(this one on {backend.device(self.card)}), which one config value "
                    f"cannot name for every rank. Remove {key} from model_wrapper_cfg: "
                    "mmgcu sets it for every rank."
                )
        if cfg.get("type", "MMDistributedDataParallel") in _STOCK_DDP:  # mmengine's default
            cfg["type"] = "GCUDistributedDataParallel"
        wrapper = MODEL_WRAPPERS.get(cfg["type"])
        if issubclass(wrapper, GCUDistributedDataParallel):
            if model_wrapper_cfg is None:  # mmengine's defaults for a missing cfg
                cfg.update(
                    broadcast_buffers=False,
                    find_unused_parameters=self.cfg.get("find_unused_parameters", False),
                )
        elif issubclass(wrapper, torch.nn.parallel.DistributedDataParallel):
            # A user's own DDP subclass: the card's arguments and card-tensor group too.
            for key, value in backend.ddp_device_kwargs(self.card).items():
                cfg.setdefault(key, value)
            if device_group() is not None:
                cfg.setdefault("process_group", device_group())
        return MODEL_WRAPPERS.build(cfg, default_args=dict(module=model))

    # -- stock components that assume CUDA: their GCU counterparts ------------------
    def _on_gcu(self) -> bool:
        return self.device_backend.is_gcu

    def set_randomness(self, seed, diff_rank_seed: bool = False, deterministic: bool = False):
        """mmengine's seeding, plus the cards' generators (torch_gcu 1.x needs its own)."""
        super().set_randomness(seed, diff_rank_seed=diff_rank_seed, deterministic=deterministic)
        self.device_backend.manual_seed_all(self._seed)

    def build_optim_wrapper(self, optim_wrapper):
        if self._on_gcu() and isinstance(optim_wrapper, dict) and "optimizer" in optim_wrapper:
            optim_wrapper = _gcu_counterpart(optim_wrapper, default="OptimWrapper")
        return super().build_optim_wrapper(optim_wrapper)

    def build_val_loop(self, loop):
        if self._on_gcu():
            loop = _gcu_counterpart(loop, default="ValLoop")
        return super().build_val_loop(loop)

    def build_test_loop(self, loop):
        if self._on_gcu():
            loop = _gcu_counterpart(loop, default="TestLoop")
        return super().build_test_loop(loop)

    def build_log_processor(self, log_processor):
        if self._on_gcu():
            log_processor = _gcu_counterpart(log_processor, default="LogProcessor")
        return super().build_log_processor(log_processor)

    def register_custom_hooks(self, hooks) -> None:
        if self._on_gcu():
            hooks = [_gcu_counterpart(h) for h in hooks]
        super().register_custom_hooks(hooks)

    def load_checkpoint(self, filename, *args, **kwargs):
        """mmengine's loading of the checkpoint the config names (``load_from``/``resume``).

        mmengine 0.10.7 calls ``torch.load`` without ``weights_only``; torch >= 2.6 then
        refuses its checkpoints (they pickle a HistoryBuffer and numpy objects). This
        keeps mmengine's trust in the user's own checkpoint, for these loads only.
        """
        with _full_unpickling():
            return super().load_checkpoint(filename, *args, **kwargs)

    @master_only
    def save_checkpoint(self, out_dir, filename, *args, **kwargs):
        """mmengine's checkpoint (rank 0), written to a temporary name then renamed.

        A job killed mid-write leaves the previous checkpoint and ``last_checkpoint``
        intact, so ``--resume`` continues from the last complete one.
        """
        if "://" in str(out_dir):  # a remote backend: its own write semantics
            return super().save_checkpoint(out_dir, filename, *args, **kwargs)
        partial = osp.join(out_dir, f".{filename}.partial")
        try:
            super().save_checkpoint(out_dir, osp.basename(partial), *args, **kwargs)
        except BaseException:
            if osp.exists(partial):  # e.g. a full disk: give the space back
                os.remove(partial)
            raise
        os.replace(partial, osp.join(out_dir, filename))

    def register_hooks(self, default_hooks=None, custom_hooks=None) -> None:
        """mmengine's hooks, plus the placement check unless the config turns it off."""
        super().register_hooks(default_hooks, custom_hooks)
        if self.cfg.get("gcu_placement_check", True) and not any(
            isinstance(h, GCUDevicePlacementHook) for h in self._hooks
        ):
            self.register_hook(GCUDevicePlacementHook())

    def train(self) -> torch.nn.Module:
        with self._casualty():
            return super().train()

    def val(self) -> dict:
        with self._casualty():
            return super().val()

    def test(self) -> dict:
        with self._casualty():
            return super().test()

    @contextlib.contextmanager
    def _casualty(self):
        """Let the rank that failed first be the one the launcher reports.

        When a rank fails, its peers' collectives fail as soon as its connections close,
        while it is still tearing down; a peer that exits first is what torchrun then
        names as the root cause. A rank whose collective lost a peer says so and waits
        (bounded) so the launcher sees the failed rank exit first and stops the job.
        """
        try:
            yield
        except Exception as exc:
            if not (self.distributed and lost_peer(exc)):
                raise
            self.logger.error(
                "rank %d: a collective failed because another rank stopped (%s: %s); "
                "that rank's error is the cause. Waiting up to %.0f s for the launcher "
                "to stop the job.",
                self.rank,
                type(exc).__name__,
                (str(exc).splitlines() or [""])[0][:200],
                self.peer_loss_grace_s,
            )
            time.sleep(self.peer_loss_grace_s)
            raise
