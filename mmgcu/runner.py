"""``GCURunner``: mmengine's Runner, placed on GCU cards.

Selected by ``runner_type='GCURunner'`` (``configs/_base_/gcu_runtime.py`` sets it), so
the stock ``tools/train.py`` of mmsegmentation runs unchanged. It chooses the accelerator
once (``setup_env``) and hands it to what it builds. It overrides where stock mmengine
assumes CUDA: the distributed set-up, the model's placement and DDP (``wrap_model``),
seeding, and the classes of :mod:`mmgcu.counterparts`. It adds a one-time placement check,
CPU-only checkpoints written atomically, a resume that is never silent
(:mod:`mmgcu.checkpoint`), locks that keep a second job off its cards and work dir
(:mod:`mmgcu.locks`), a watchdog that ends a job a hung rank blocks (:mod:`mmgcu.watchdog`),
and a wait that lets the launcher name the rank that failed first. Everything else is
mmengine's.
"""

import contextlib
import time
from typing import Optional

import torch
from mmengine.dist import is_distributed, is_main_process
from mmengine.logging import print_log
from mmengine.model import convert_sync_batchnorm, is_model_wrapper, revert_sync_batchnorm
from mmengine.optim import OptimWrapperDict
from mmengine.registry import HOOKS, LOG_PROCESSORS, LOOPS, MODEL_WRAPPERS, OPTIM_WRAPPERS, RUNNERS
from mmengine.runner import Runner

from .binding import CardBound
from .checkpoint import load_problem, resume_target, save_atomically
from .checkpoint_globals import mmengine_checkpoint_globals
from .counterparts import Counterparts
from .device import Accelerator, GCUError, select_accelerator
from .dist import init_distributed, lost_peer
from .errors import stop_every_rank
from .hooks import CPUCheckpointHook, GCUDevicePlacementHook
from .locks import hold as hold_locks
from .message_hub import CardMessageHub
from .model import (
    GCU1DistributedDataParallel,
    GCUDistributedDataParallel,
    GCUSyncBatchNorm,
    convert_gcu_mmcv_ops,
    convert_gcu_sync_batchnorm,
    revert_gcu_sync_batchnorm,
)
from .model.placement import watch_first_batch
from .model.wrappers import ddp_config, torch_ddp_names
from .optim.wrappers import CardStep
from .rank_warnings import show_library_warnings_on_rank_0
from .watchdog import NoWatchdog, build_watchdog

_GCU_DDP = (GCUDistributedDataParallel, GCU1DistributedDataParallel)
_TORCH_DDP = torch.nn.parallel.DistributedDataParallel


@RUNNERS.register_module()
class GCURunner(Runner):
    """A :class:`mmengine.runner.Runner` that trains on this rank's GCU card.

    Config keys it reads besides mmengine's:

    - ``env_cfg.device``: ``'auto'`` (default: torch_gcu 2.x, then 1.x, then CUDA, then
      CPU), ``'gcu'`` (either GCU generation, or stop), ``'gcu2'`` (alias ``'v2'``),
      ``'gcu1'`` (alias ``'legacy'``), ``'cuda'`` or ``'cpu'``.
    - ``env_cfg.gcu_jit_mode``: torch_gcu 1.x's ``JitRunMode`` for the step
      (``'ASYNC'``, ``'SAFEASYNC'``, ``'SYNC'``); by default ASYNC with several ranks and
      SAFEASYNC with one, as Enflame's own training scripts do.
    - ``env_cfg.dist_cfg.backend``: left out, ``'eccl'`` or ``'nccl'`` all mean the
      device's backend; ``'gloo'`` is refused on torch_gcu 2.x (it cannot carry card
      tensors) and is the default group on 1.x (card tensors have an ECCL group).
    - ``gcu_placement_check``: ``False`` to drop :class:`GCUDevicePlacementHook`.
    - ``gcu_defer_scalars``: ``False`` to read every logged scalar from the card as it is
      logged, as stock mmengine does (see :mod:`mmgcu.message_hub`).

    Attributes:
        accelerator: the :class:`~mmgcu.device.Accelerator` this runner trains on; it is
            bound to every GCU hook, loop and log processor the runner builds
            (:class:`~mmgcu.binding.CardBound`).
        watchdog: the :class:`~mmgcu.watchdog.GCUWatchdogHook` of a distributed run, else
            a :class:`~mmgcu.watchdog.NoWatchdog`.
    """

    #: Seconds a rank whose collective lost a peer waits before it exits.
    peer_loss_grace_s = 10.0

    def __init__(self, *args, **kwargs):
        # Set by setup_env and register_hooks, which mmengine's __init__ calls.
        self.accelerator: Optional[Accelerator] = None
        self.counterparts: Optional[Counterparts] = None
        self.watchdog = NoWatchdog()
        self._locks = None
        show_library_warnings_on_rank_0()  # before the model and hooks warn, once per rank
        super().__init__(*args, **kwargs)

    @property
    def card(self) -> int:
        """This rank's card on its node: the accelerator's current card (its one source)."""
        return self.accelerator.current_device()

    def setup_env(self, env_cfg: dict) -> None:
        """Choose the accelerator, set this rank's card, then create the process groups."""
        self.accelerator = select_accelerator(
            env_cfg.get("device", "auto"), env_cfg.get("gcu_jit_mode")
        )
        self.counterparts = Counterparts(self.accelerator)
        if self.distributed and not is_distributed():
            dist_cfg = dict(env_cfg.get("dist_cfg", {}))
            backend = dist_cfg.pop("backend", None)
            init_distributed(self.accelerator, self.launcher, backend, **dist_cfg)
        elif self.distributed:  # the caller created the group
            self.accelerator.adopt_process_groups()
        else:
            self.accelerator.set_device(0)
        if env_cfg.get("cudnn_benchmark") and self.accelerator.kind != "cuda":
            env_cfg = {k: v for k, v in env_cfg.items() if k != "cudnn_benchmark"}
        # The rest is mmengine's: multiprocessing, timestamp broadcast, rlimit.
        super().setup_env(env_cfg)
        # A second job on these cards or work dir stops here.
        self._locks = hold_locks(self.accelerator, self.rank, self.work_dir, self.distributed)

    def set_randomness(self, seed, diff_rank_seed: bool = False, deterministic: bool = False):
        """mmengine's seeding, plus the cards' generators (torch_gcu 1.x needs its own)."""
        super().set_randomness(seed, diff_rank_seed=diff_rank_seed, deterministic=deterministic)
        self.accelerator.manual_seed_all(self.seed)

    # -- the model -----------------------------------------------------------------
    def wrap_model(self, model_wrapper_cfg, model):
        """Move the model to this rank's card, then wrap it in the accelerator's DDP."""
        if is_model_wrapper(model):
            return super().wrap_model(model_wrapper_cfg, model)
        if self.accelerator.is_gcu:
            model = self._card_ops(model)
        device = self.accelerator.device(self.card)
        model = model.to(device)
        watch_first_batch(model, device)
        if not self.distributed:
            return revert_gcu_sync_batchnorm(revert_sync_batchnorm(model))
        model = self._sync_batchnorm(model)
        if model_wrapper_cfg is None:  # mmengine's defaults for a missing cfg
            model_wrapper_cfg = dict(
                broadcast_buffers=False,
                find_unused_parameters=self.cfg.get("find_unused_parameters", False),
            )
        cfg = ddp_config(model_wrapper_cfg, self.accelerator, self.card)
        cfg = self.counterparts.resolve(cfg, MODEL_WRAPPERS, default="MMDistributedDataParallel")
        if isinstance(cfg["type"], type) and issubclass(cfg["type"], _TORCH_DDP):
            cfg = torch_ddp_names(cfg)
        return MODEL_WRAPPERS.build(cfg, default_args=self._wrapper_args(cfg["type"], model))

    def _card_ops(self, model: torch.nn.Module) -> torch.nn.Module:
        """mmcv's compiled ops replaced by counterparts a card can run (mmcv dispatches them
        by device type, and a GCU has no kernel: "psamask_forward_impl: implementation for
        device gcu:1 not found")."""
        model, replaced = convert_gcu_mmcv_ops(model)
        if replaced:
            ops = ", ".join(f"{name} x{count} as GCU{name}" for name, count in replaced)
            print_log(
                f"mmgcu: mmcv ops with no card kernel run on the card as ordinary tensor ops: "
                f"{ops}",
                logger="current",
            )
        return model

    def _wrapper_args(self, wrapper, model: torch.nn.Module) -> dict:
        if not isinstance(wrapper, type):  # an unknown name: mmengine's registry says so
            return dict(module=model)
        if issubclass(wrapper, _GCU_DDP):
            return dict(module=model, accelerator=self.accelerator)
        if issubclass(wrapper, torch.nn.parallel.DistributedDataParallel):
            if self.accelerator.kind == "gcu1":
                raise GCUError(
                    f"model_wrapper_cfg.type={wrapper.__name__} is a torch "
                    "DistributedDataParallel, which cannot train on torch_gcu 1.x (its DDP is "
                    "torch_gcu.nn.parallel.DistributedDataParallel, over ECCL). Remove "
                    "model_wrapper_cfg.type: mmgcu builds GCU1DistributedDataParallel."
                )
            return dict(module=model, **self.accelerator.ddp_kwargs(self.card))
        return dict(module=model)

    def _sync_batchnorm(self, model: torch.nn.Module) -> torch.nn.Module:
        """SyncBN layers that synchronise on this device: torch's own on CUDA; elsewhere
        :class:`GCUSyncBatchNorm` over the card group (no GCU has torch's SyncBN kernels,
        and the CPU has none either). ``cfg.sync_bn`` converts plain BN first, as in mmengine."""
        sync_bn = self.cfg.get("sync_bn", None)
        if sync_bn is not None:
            model = convert_sync_batchnorm(model, sync_bn)
        if self.accelerator.kind == "cuda":
            return model
        group = self.accelerator.card_group
        model = convert_gcu_sync_batchnorm(model, group)
        layers = sum(isinstance(m, GCUSyncBatchNorm) for m in model.modules())
        if layers:
            print_log(
                f"mmgcu: SyncBN: {layers} layer(s) synchronised across {group.world_size} "
                f"cards by GCUSyncBatchNorm over {group.name}",
                logger="current",
            )
        return model

    # -- what mmengine builds from the config ----------------------------------------
    def _bind(self, built):
        """``built`` bound to this runner's accelerator when it is a GCU class."""
        if isinstance(built, CardBound):
            built.bind(self.accelerator)
        return built

    def build_message_hub(self, message_hub=None):
        """mmengine's hub; on GCU cards wrapped so that step scalars stay on the card until
        something reads them (``gcu_defer_scalars=False`` turns this off)."""
        hub = super().build_message_hub(message_hub)
        if self.accelerator.is_gcu and self.cfg.get("gcu_defer_scalars", True):
            return CardMessageHub(hub)
        return hub

    def build_optim_wrapper(self, optim_wrapper):
        if not isinstance(optim_wrapper, dict) or "optimizer" in optim_wrapper:
            optim_wrapper = self.counterparts.resolve(optim_wrapper, OPTIM_WRAPPERS, "OptimWrapper")
        built = super().build_optim_wrapper(optim_wrapper)
        wrappers = built.values() if isinstance(built, OptimWrapperDict) else [built]
        for wrapper in wrappers:
            if isinstance(wrapper, CardStep):
                wrapper.bind(self.accelerator, self.model, self.message_hub)
        return built

    def build_val_loop(self, loop):
        loop = self.counterparts.resolve(loop, LOOPS, "ValLoop")
        return self._bind(super().build_val_loop(loop))

    def build_test_loop(self, loop):
        loop = self.counterparts.resolve(loop, LOOPS, "TestLoop")
        return self._bind(super().build_test_loop(loop))

    def build_log_processor(self, log_processor):
        resolved = self.counterparts.resolve(log_processor, LOG_PROCESSORS, "LogProcessor")
        return self._bind(super().build_log_processor(resolved))

    def register_hook(self, hook, priority=None) -> None:
        """mmengine's, with the GCU class where one stands in, bound to the accelerator."""
        known = {id(h) for h in self.hooks}
        super().register_hook(self.counterparts.resolve(hook, HOOKS), priority)
        for registered in self.hooks:
            if id(registered) not in known:
                self._bind(registered)

    def register_hooks(self, default_hooks=None, custom_hooks=None) -> None:
        """mmengine's hooks, the CPU-only checkpoint hook, and the placement check unless
        the config turns it off."""
        super().register_hooks(default_hooks, custom_hooks)
        self.register_hook(CPUCheckpointHook())
        self.watchdog = build_watchdog(self)
        if not isinstance(self.watchdog, NoWatchdog):
            self.register_hook(self.watchdog)
        if self.cfg.get("gcu_placement_check", True) and not any(
            isinstance(h, GCUDevicePlacementHook) for h in self.hooks
        ):
            self.register_hook(GCUDevicePlacementHook())

    # -- checkpoints -------------------------------------------------------------------
    def load_or_resume(self) -> None:
        """mmengine's, but ``--resume`` without ``last_checkpoint`` takes the newest
        complete checkpoint of the work dir (logged) instead of training from iteration 0."""
        if self._resume and self._load_from is None and not self._has_loaded:
            try:
                self._load_from, note = resume_target(self.work_dir)
            except GCUError as e:
                stop_every_rank(str(e), self.rank, self.world_size, self.peer_loss_grace_s)
            if note:
                self.logger.warning(f"mmgcu: --resume: {note}")
        return super().load_or_resume()

    def load_checkpoint(self, filename, *args, **kwargs):
        """mmengine's loading of the checkpoint the config names (``load_from``/``resume``),
        after a check that names a damaged file (one message, rank 0's).

        torch >= 2.6 refuses globals it does not know, and mmengine 0.10.7 checkpoints
        pickle a HistoryBuffer and numpy objects: exactly those are allow-listed for this
        load (:mod:`mmgcu.checkpoint_globals`).
        """
        problem = load_problem(filename, self.work_dir)
        if problem:
            stop_every_rank(problem, self.rank, self.world_size, self.peer_loss_grace_s)
        with mmengine_checkpoint_globals(filename):
            return super().load_checkpoint(filename, *args, **kwargs)

    def save_checkpoint(self, out_dir, filename, *args, **kwargs):
        """mmengine's checkpoint, written by rank 0 under a temporary name, fsynced, then
        renamed (:func:`mmgcu.checkpoint.save_atomically`); the other ranks wait for it
        outside any collective, so a slow save cannot trip the collective timeout.
        """
        with self.watchdog.saving():
            if not is_main_process():
                return
            if "://" in str(out_dir):  # a remote backend: its own write semantics
                return super().save_checkpoint(out_dir, filename, *args, **kwargs)
            write = super().save_checkpoint
            save_atomically(lambda name: write(out_dir, name, *args, **kwargs), out_dir, filename)

    # -- failures ----------------------------------------------------------------------
    def train(self) -> torch.nn.Module:
        with self._failed_peer_first():
            return super().train()

    def val(self) -> dict:
        with self._failed_peer_first():
            return super().val()

    def test(self) -> dict:
        with self._failed_peer_first():
            return super().test()

    @contextlib.contextmanager
    def _failed_peer_first(self):
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
            self.watchdog.explain(exc)  # a peer that hung: named
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
