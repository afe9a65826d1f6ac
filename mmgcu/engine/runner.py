"""``GCURunner``: mmengine's Runner, placed on GCU cards.

Selected by ``runner_type='GCURunner'`` (``configs/_base_/gcu_runtime.py`` sets it), so
the stock ``tools/train.py`` of mmsegmentation runs unchanged. Its ``__init__`` chooses the
accelerator and creates the collaborators it delegates to, before mmengine's ``__init__``
calls any of its methods:

- :class:`~mmgcu.engine.strategy.GCUStrategy`: this rank's card, the process groups, the
  model on its card in the accelerator's DDP (``setup_env``, ``wrap_model``);
- :class:`~mmgcu.counterparts.Counterparts`: the GCU classes that stand in for stock ones
  (``build_*``, ``register_hook``), bound to the accelerator (:mod:`mmgcu.binding`);
- :class:`~mmgcu.checkpoint.io.GCUCheckpointIO`: atomic saves, a resume that is never
  silent, a damaged file named (``save_checkpoint``, ``load_or_resume``,
  ``load_checkpoint``);
- :class:`~mmgcu.engine.fault_guard.FaultGuard`: locks, the watchdog, and how a failed
  run ends (``setup_env``, ``train``/``val``/``test``).

The config it keeps formats its text once (:class:`~mmgcu.engine.config.FormattedOnceConfig`);
everything else is mmengine's.
"""

import inspect

import torch
from mmengine.dist import is_main_process
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapperDict
from mmengine.registry import HOOKS, LOG_PROCESSORS, LOOPS, OPTIM_WRAPPERS, RUNNERS
from mmengine.runner import Runner

from ..binding import Binding, CardBound
from ..checkpoint.hooks import CPUCheckpointHook
from ..checkpoint.io import GCUCheckpointIO
from ..compat.mmengine import resume_from, resume_needs_target, runner_checkpoint
from ..counterparts import Counterparts
from ..device import select_accelerator
from ..runtime import excepthook
from ..runtime.rank_warnings import show_library_warnings_on_rank_0
from .config import FormattedOnceConfig
from .fault_guard import FaultGuard
from .hooks import GCUCompileWatchHook, GCUDevicePlacementHook
from .hooks.watchdog import GCUWatchdogHook
from .message_hub import CardMessageHub
from .strategy import GCUStrategy

_RUNNER_ARGS = inspect.signature(Runner.__init__)


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
    - ``env_cfg.watchdog``: see :mod:`mmgcu.engine.hooks.watchdog`.
    - ``gcu_placement_check``: ``False`` to drop :class:`GCUDevicePlacementHook`.
    - ``gcu_defer_scalars``: ``False`` to read every logged scalar from the card as it is
      logged, as stock mmengine does (see :mod:`mmgcu.engine.message_hub`).

    Attributes:
        accelerator: the :class:`~mmgcu.device.Accelerator` this runner trains on; it is
            bound, with the model and message hub, to every GCU hook, loop, log processor
            and optimizer wrapper the runner builds (:class:`~mmgcu.binding.Binding`).
        counterparts: the stock-to-GCU class resolution on that accelerator.
        strategy: the :class:`~mmgcu.engine.strategy.GCUStrategy`.
        checkpoint_io: the :class:`~mmgcu.checkpoint.io.GCUCheckpointIO`.
        guard: the :class:`~mmgcu.engine.fault_guard.FaultGuard`.
    """

    def __init__(self, *args, **kwargs):
        given = _RUNNER_ARGS.bind(self, *args, **kwargs)
        given.apply_defaults()
        env_cfg = dict(given.arguments["env_cfg"] or {})
        launcher = given.arguments["launcher"]
        excepthook.install()  # a GCUError is printed alone, from here on
        show_library_warnings_on_rank_0()  # before the model and hooks warn, once per rank
        self.accelerator = select_accelerator(
            env_cfg.get("device", "auto"), env_cfg.get("gcu_jit_mode")
        )
        self.counterparts = Counterparts(self.accelerator)
        self.strategy = GCUStrategy(self.accelerator, self.counterparts, launcher)
        self.checkpoint_io = GCUCheckpointIO()
        self.guard = FaultGuard(self.accelerator, env_cfg, self.strategy.distributed)
        given.arguments["cfg"] = FormattedOnceConfig.of(given.arguments["cfg"])
        super().__init__(*given.args[1:], **given.kwargs)

    @property
    def card(self) -> int:
        """This rank's card on its node (the accelerator's current card)."""
        return self.strategy.card

    def setup_env(self, env_cfg: dict) -> None:
        """This rank's card and the process groups first, then mmengine's set-up
        (multiprocessing, timestamp broadcast, rlimit), then this rank's locks and the
        config's text, formatted by rank 0 for all."""
        super().setup_env(self.strategy.setup(env_cfg))
        self.guard.start(self.rank, self.world_size, self.work_dir)
        if self.world_size > 1 and isinstance(self.cfg, FormattedOnceConfig):
            self.cfg.share_from_rank_0()  # before every rank logs it

    def set_randomness(self, seed, diff_rank_seed: bool = False, deterministic: bool = False):
        """mmengine's seeding, plus the cards' generators (torch_gcu 1.x needs its own)."""
        super().set_randomness(seed, diff_rank_seed=diff_rank_seed, deterministic=deterministic)
        self.accelerator.manual_seed_all(self.seed)

    def wrap_model(self, model_wrapper_cfg, model):
        """The model on this rank's card, in the accelerator's DDP (the strategy's)."""
        if is_model_wrapper(model):
            return super().wrap_model(model_wrapper_cfg, model)
        return self.strategy.wrap(
            model,
            model_wrapper_cfg,
            sync_bn=self.cfg.get("sync_bn", None),
            find_unused_parameters=self.cfg.get("find_unused_parameters", False),
            whole_graph=self.cfg.get("gcu_whole_graph", True),
        )

    # -- what mmengine builds from the config ----------------------------------------
    def _bind(self, *built) -> None:
        """Bind each of ``built`` that is a GCU class to this runner's accelerator, model
        and message hub (those built so far: the log processor comes before both)."""
        binding = Binding(
            self.accelerator, getattr(self, "model", None), getattr(self, "message_hub", None)
        )
        for obj in built:
            if isinstance(obj, CardBound):
                obj.bind(binding)

    def build_message_hub(self, message_hub=None):
        """mmengine's hub; on GCU cards one that keeps step scalars on the card until
        something reads them (``gcu_defer_scalars=False`` turns this off)."""
        if self.accelerator.is_gcu and self.cfg.get("gcu_defer_scalars", True):
            return CardMessageHub.build(message_hub, self.experiment_name)
        return super().build_message_hub(message_hub)

    def build_optim_wrapper(self, optim_wrapper):
        if not isinstance(optim_wrapper, dict) or "optimizer" in optim_wrapper:
            optim_wrapper = self.counterparts.resolve(optim_wrapper, OPTIM_WRAPPERS, "OptimWrapper")
        built = super().build_optim_wrapper(optim_wrapper)
        self._bind(*(built.values() if isinstance(built, OptimWrapperDict) else [built]))
        return built

    def build_val_loop(self, loop):
        loop = super().build_val_loop(self.counterparts.resolve(loop, LOOPS, "ValLoop"))
        self._bind(loop)
        return loop

    def build_test_loop(self, loop):
        loop = super().build_test_loop(self.counterparts.resolve(loop, LOOPS, "TestLoop"))
        self._bind(loop)
        return loop

    def build_log_processor(self, log_processor):
        resolved = self.counterparts.resolve(log_processor, LOG_PROCESSORS, "LogProcessor")
        processor = super().build_log_processor(resolved)
        self._bind(processor)
        return processor

    def register_hook(self, hook, priority=None) -> None:
        """mmengine's, with the GCU class where one stands in, bound to the accelerator."""
        known = {id(h) for h in self.hooks}
        super().register_hook(self.counterparts.resolve(hook, HOOKS), priority)
        self._bind(*(h for h in self.hooks if id(h) not in known))

    def register_hooks(self, default_hooks=None, custom_hooks=None) -> None:
        """mmengine's hooks, the CPU-only checkpoint hook, the watchdog of a distributed
        run, the placement check unless the config turns it off, and on a lazy card the
        watch of its compiles (``gcu_compile_watch=False`` turns it off)."""
        super().register_hooks(default_hooks, custom_hooks)
        self.register_hook(CPUCheckpointHook())
        if isinstance(self.guard.watchdog, GCUWatchdogHook):
            self.register_hook(self.guard.watchdog)
        if self.accelerator.lazy and self.cfg.get("gcu_compile_watch", True):
            if not any(isinstance(h, GCUCompileWatchHook) for h in self.hooks):
                self.register_hook(GCUCompileWatchHook())
        if self.cfg.get("gcu_placement_check", True) and not any(
            isinstance(h, GCUDevicePlacementHook) for h in self.hooks
        ):
            self.register_hook(GCUDevicePlacementHook())

    # -- checkpoints -------------------------------------------------------------------
    def load_or_resume(self) -> None:
        """mmengine's, but ``--resume`` without ``last_checkpoint`` takes the newest
        complete checkpoint of the work dir (logged) instead of training from iteration 0."""
        if resume_needs_target(self):
            with self.guard.said_once():
                target, note = self.checkpoint_io.resume_target(self.work_dir)
            resume_from(self, target)
            if note:
                self.logger.warning(f"mmgcu: --resume: {note}")
        return super().load_or_resume()

    def load_checkpoint(self, filename, *args, **kwargs):
        """mmengine's loading of the checkpoint the config names (``load_from``/``resume``),
        after a check that names a damaged file (one message, rank 0's), with mmengine's
        own checkpoint globals allowed for this load."""
        with self.guard.said_once():
            self.checkpoint_io.check(filename, self.work_dir)
        with self.checkpoint_io.loading(filename):
            return super().load_checkpoint(filename, *args, **kwargs)

    def save_checkpoint(
        self,
        out_dir,
        filename,
        file_client_args=None,
        save_optimizer=True,
        save_param_scheduler=True,
        meta=None,
        by_epoch=True,
        backend_args=None,
    ):
        """mmengine's checkpoint, written by rank 0 atomically (on a local disk straight
        to the file, not first into memory); the other ranks wait for it outside any
        collective, so a slow save cannot trip the collective timeout."""
        with self.guard.saving():
            if not is_main_process():
                return
            if file_client_args is None and self.checkpoint_io.writes_itself(out_dir, backend_args):
                checkpoint = runner_checkpoint(
                    self, meta, save_optimizer, save_param_scheduler, by_epoch
                )
                self.checkpoint_io.write(checkpoint, out_dir, filename)
                return
            options = dict(
                file_client_args=file_client_args,
                save_optimizer=save_optimizer,
                save_param_scheduler=save_param_scheduler,
                meta=meta,
                by_epoch=by_epoch,
                backend_args=backend_args,
            )
            write = super().save_checkpoint
            self.checkpoint_io.save(
                lambda name: write(out_dir, name, **options), out_dir, filename, backend_args
            )

    # -- failures ----------------------------------------------------------------------
    def train(self) -> torch.nn.Module:
        with self.guard.failed_peer_first(self.logger):
            return super().train()

    def val(self) -> dict:
        with self.guard.failed_peer_first(self.logger):
            return super().val()

    def test(self) -> dict:
        with self.guard.failed_peer_first(self.logger):
            return super().test()
