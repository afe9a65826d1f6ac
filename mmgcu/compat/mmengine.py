"""mmengine 0.10.7's private API, in one place.

mmgcu extends mmengine through its registries and public methods. Where mmengine offers no
public seam, the private member is used here, and only here: each piece below names what it
uses, and :data:`UPSTREAM` records a digest of the upstream source it relies on, so that
``tests/compat/test_mmengine.py`` fails on an mmengine whose source differs and names what
to re-read. The rest of mmgcu imports the public names of this module (a test checks that no
other module touches a private mmengine name).
"""

import hashlib
import inspect
import os
import subprocess
import time
import traceback
from typing import Optional

import mmengine
import torch
from mmengine.hooks import CheckpointHook, EmptyCacheHook
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.model import MMDistributedDataParallel, is_model_wrapper
from mmengine.model.utils import _BatchNormXd
from mmengine.optim import OptimWrapper
from mmengine.runner.checkpoint import weights_to_cpu
from mmengine.utils import apply_to, get_git_hash

from ..errors import GCUError

#: The mmengine release the pieces below mirror.
MMENGINE_VERSION = "0.10.7"

#: sha256 of ``inspect.getsource`` of each upstream object a piece below relies on.
UPSTREAM = {
    # TensorGradNorm mirrors it.
    "mmengine.optim.OptimWrapper._clip_grad": (
        "a3d132f6d5e8116fbe144e1d6e0b96e3630b0f2a9911c611ae2881678aac117b"
    ),
    # init_amp_optim_wrapper mirrors it.
    "mmengine.optim.AmpOptimWrapper.__init__": (
        "36ef25493b8370c3d1d706561d0a7835af1758846c9e9cadd57f195d5afce8a5"
    ),
    # MMDDPSteps reuses them.
    "mmengine.model.MMDistributedDataParallel.train_step": (
        "0109ef3475407f922bcc9ce485615b44e6b359fbdc1cb328d2e1769736e7b2e6"
    ),
    "mmengine.model.MMDistributedDataParallel.val_step": (
        "4db131f37f2c8e5e65e58c95ac6f5738dae79d394b749209bf2ce50e2f4b8da3"
    ),
    "mmengine.model.MMDistributedDataParallel.test_step": (
        "d5a26477c63a54109bbc2e1746c00b0611387449df78a1809f7df6602771d3fd"
    ),
    "mmengine.model.MMDistributedDataParallel._run_forward": (
        "67dfa91184a1ef1192965110ecc791407d3fb89c53c7bc8b1b8159cc004afb26"
    ),
    # StepSaveCheckpointHook (the whole hook: what calls the per-step save), EmptyCacheHookPoints.
    "mmengine.hooks.CheckpointHook": (
        "da0a54f619e65e0b7de96ded055a0d6fd13158c1c63257696ac421ff1f4510cd"
    ),
    "mmengine.hooks.CheckpointHook._save_checkpoint_with_step": (
        "cdbc1b54c7c88d9525ab025a9d51a3d3be6e6e36396c0f1151ecf51281fd3482"
    ),
    "mmengine.hooks.EmptyCacheHook": (
        "acdd39cf486bfba6df5ee84397c0ba33c44ba0cd068d58793d6bfbb3595b4ab1"
    ),
    # runner_checkpoint mirrors the first, less its write (the second's local branch:
    # torch.save of the whole checkpoint into an io.BytesIO, then to the file).
    "mmengine.runner.Runner.save_checkpoint": (
        "6d6aff0fa55c3d160898e28d993be0370d11e592ceba27e94b66ec22c2932356"
    ),
    "mmengine.runner.checkpoint.save_checkpoint": (
        "7f60c6ca167fd4dd0a69600b525067f105ea97f1d80e8aa60022e88d4b90b1eb"
    ),
    # resume_needs_target, resume_from.
    "mmengine.runner.Runner.load_or_resume": (
        "9c653d074f9216315d8fe9fb6db0e24e7bbcd386b4f5dfb9d8932be55bb6e68b"
    ),
    # STOCK_INIT_DIST, set_slurm_env, set_mpi_env.
    "mmengine.dist.utils._init_dist_pytorch": (
        "8a14beff62037f6b5e3e4abd4563f6d4a08f658a04ed5b04a0d47185caa8b614"
    ),
    "mmengine.dist.utils.init_dist": (
        "8d608a073e8f6e900852f754c05592c20af61e25d7b4fed9cb7fd78ed3a371ed"
    ),
    "mmengine.dist.utils._init_dist_slurm": (
        "cf778da1f8c196206d65a2867aa6bd22fecaf8469501f6522a10d5e814e9cabe"
    ),
    "mmengine.dist.utils._init_dist_mpi": (
        "5872f56140d33e49c9e9bb51bdae261ecf6ea0b895fe5bd07735514a7235c9ca"
    ),
    # make_current_message_hub; CardMessageHub.build mirrors Runner.build_message_hub, and
    # its update_scalar is what MessageHub.update_scalars calls.
    "mmengine.utils.ManagerMixin.get_current_instance": (
        "ebdfab4a1e34c45d8d162ca9ecb838915219eee378ee1a96a944b3b4455b56e6"
    ),
    "mmengine.logging.MessageHub.get_current_instance": (
        "c2f386dca53cd585c400ae7f2b8487b67315a49871e5ecedc72a3f920e5751b1"
    ),
    "mmengine.logging.MessageHub.update_scalars": (
        "35b084d8d2e00fddd5be5bbd1349d4fb555af0214fa9983e4e72f78aee4609d4"
    ),
    "mmengine.logging.MessageHub.get_scalar": (
        "8a2f89d977344ec6f4ec8ba0fa802dbbb8f18a07ea6e78b30f1407c272c0ddff"
    ),
    "mmengine.runner.Runner.build_message_hub": (
        "7126df3c1cfd5011959f0bb7269e2da6b2bf3be94138a2ca14819321325f0365"
    ),
    # make_current_message_hub: where ManagerMixin keeps a class's instances.
    "mmengine.utils.manager.ManagerMeta.__init__": (
        "76bdd7f0928f99aef7c24049f5079b73cfa6e891b92bd76e281a853967cd0970"
    ),
    # history_statistics.
    "mmengine.logging.HistoryBuffer": (
        "0b351b685d552f7d86a4b48e4cd79a8f7cd214ebd6d6f7a38aabd2608ba30ad0"
    ),
    # BatchNormXd.
    "mmengine.model.utils._BatchNormXd": (
        "717e60288a55060bfb329f3f1a58926bfedd5ba02fdac8cb3a9bb74bb176967e"
    ),
}


def upstream_source(qualified: str) -> str:
    """The source of the mmengine object named ``qualified`` (``module.Class.member``),
    without its decorators (Python 3.8's ``inspect.getsource`` leaves a class's out)."""
    import importlib

    parts = qualified.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        lines = inspect.getsource(obj).splitlines(keepends=True)
        while lines and lines[0].lstrip().startswith("@"):
            lines.pop(0)
        return "".join(lines)
    raise ImportError(qualified)


def upstream_digest(qualified: str) -> str:
    return hashlib.sha256(upstream_source(qualified).encode()).hexdigest()


def changed_upstream() -> dict:
    """``{name: its digest here}`` of each :data:`UPSTREAM` object whose source differs
    from the one mmgcu relies on (empty on the mmengine it mirrors)."""
    now = {name: upstream_digest(name) for name in UPSTREAM}
    return {name: digest for name, digest in now.items() if digest != UPSTREAM[name]}


# -- model ------------------------------------------------------------------------------

#: The plain BatchNorm of any rank that ``mmengine.model.revert_sync_batchnorm`` builds
#: (private in mmengine: ``mmengine.model.utils._BatchNormXd``).
BatchNormXd = _BatchNormXd


class MMDDPSteps:
    """``MMDistributedDataParallel``'s train, val and test steps for a wrapper that is not
    one: they need only ``.module``, ``forward``, ``_run_forward`` (private) and
    ``detect_anomalous_params``."""

    train_step = MMDistributedDataParallel.train_step
    val_step = MMDistributedDataParallel.val_step
    test_step = MMDistributedDataParallel.test_step
    _run_forward = MMDistributedDataParallel._run_forward


# -- optimizer wrappers -------------------------------------------------------------------


class TensorGradNorm:
    """``OptimWrapper._clip_grad`` (private), logging the norm as the tensor it is, through
    :meth:`log_grad_norm`: mmengine's ``float(grad)`` reads the card every step."""

    def _clip_grad(self) -> None:
        self.clip_grad()

    def clip_grad(self) -> None:
        """Clip the gradients as ``clip_grad`` asks; log the norm without reading it."""
        params = [
            p
            for group in self.optimizer.param_groups
            for p in group["params"]
            if p.requires_grad and p.grad is not None
        ]
        if params:
            grad = self.clip_func(params, **self.clip_grad_kwargs)
            if grad is not None:  # clip_grad_value_ returns None
                self.log_grad_norm(grad)

    def log_grad_norm(self, norm: torch.Tensor) -> None:
        self.message_hub.update_scalar(f"train/{self.grad_name}", norm)


def init_amp_optim_wrapper(wrapper, loss_scale, **kwargs) -> dict:
    """``AmpOptimWrapper.__init__`` without its CUDA assertion and CUDA ``GradScaler``:
    ``OptimWrapper.__init__``, then the private ``_scale_update_param`` that its
    ``state_dict`` and ``step`` read. Returns the ``GradScaler`` arguments ``loss_scale``
    asks for."""
    OptimWrapper.__init__(wrapper, **kwargs)
    wrapper._scale_update_param = None
    if loss_scale == "dynamic":
        return {}
    if isinstance(loss_scale, float):
        wrapper._scale_update_param = loss_scale
        return dict(init_scale=loss_scale)
    if isinstance(loss_scale, dict):
        return dict(loss_scale)
    raise TypeError(f'loss_scale must be of type float, dict, or "dynamic", but got {loss_scale}')


# -- hooks --------------------------------------------------------------------------------


class StepSaveCheckpointHook(CheckpointHook):
    """``CheckpointHook`` whose private per-step save (``_save_checkpoint_with_step``) is
    :meth:`save_step`, for a subclass to override."""

    def _save_checkpoint_with_step(self, runner, step, meta):
        return self.save_step(runner, step, meta)

    def save_step(self, runner, step, meta):
        """Save the checkpoint of ``step``: mmengine's."""
        return super()._save_checkpoint_with_step(runner, step, meta)


class EmptyCacheHookPoints(EmptyCacheHook):
    """``EmptyCacheHook`` whose three private points (``_after_iter``, ``_before_epoch``,
    ``_after_epoch``, each asked for by a private ``_do_*`` flag its options set) are first
    offered to :meth:`empty_on_card`, for a subclass to override; mmengine's hook does what
    that leaves."""

    def _after_iter(self, runner, batch_idx, data_batch=None, outputs=None, mode="train"):
        if not self.empty_on_card(runner, self._do_after_iter):
            super()._after_iter(runner, batch_idx, data_batch, outputs, mode)

    def _before_epoch(self, runner, mode="train"):
        if not self.empty_on_card(runner, self._do_before_epoch):
            super()._before_epoch(runner, mode)

    def _after_epoch(self, runner, mode="train"):
        if not self.empty_on_card(runner, self._do_after_epoch):
            super()._after_epoch(runner, mode)

    def empty_on_card(self, runner, asked: bool) -> bool:
        """Empty the card's cache if ``asked`` (the point's option); return whether this
        point was handled here (False: mmengine's hook handles it)."""
        return False


# -- the runner ---------------------------------------------------------------------------


def resume_needs_target(runner) -> bool:
    """Whether ``Runner.load_or_resume`` is about to resume with no checkpoint named
    (``--resume`` alone, no ``last_checkpoint`` found yet): its private ``_resume``,
    ``_load_from`` and ``_has_loaded``."""
    return bool(runner._resume) and runner._load_from is None and not runner._has_loaded


def resume_from(runner, checkpoint: str) -> None:
    """Make ``Runner.load_or_resume`` resume from ``checkpoint`` (its ``_load_from``)."""
    runner._load_from = checkpoint


def runner_checkpoint(
    runner, meta=None, save_optimizer=True, save_param_scheduler=True, by_epoch=True
) -> dict:
    """The checkpoint ``Runner.save_checkpoint`` writes, after its ``before_save_checkpoint``
    hooks: that method's body less the file's path and the write, for a caller that writes
    the file itself (mmengine's ``save_checkpoint`` first pickles it all into memory)."""
    if meta is None:
        meta = {}
    elif not isinstance(meta, dict):
        raise TypeError(f"meta should be a dict or None, but got {type(meta)}")
    if by_epoch:
        # save_checkpoint runs in after_train_epoch, before the epoch counter moves on
        meta.setdefault("epoch", runner.epoch + 1)
        meta.setdefault("iter", runner.iter)
    else:
        meta.setdefault("epoch", runner.epoch)
        meta.setdefault("iter", runner.iter + 1)
    meta.update(
        cfg=runner.cfg.pretty_text,
        seed=runner.seed,
        experiment_name=runner.experiment_name,
        time=time.strftime("%Y%m%d_%H%M%S", time.localtime()),
        mmengine_version=mmengine.__version__ + get_git_hash(),
    )
    if hasattr(runner.train_dataloader.dataset, "metainfo"):
        meta.update(dataset_meta=runner.train_dataloader.dataset.metainfo)
    model = runner.model.module if is_model_wrapper(runner.model) else runner.model

    def to_cpu(tree):
        return apply_to(tree, lambda x: hasattr(x, "cpu"), lambda x: x.cpu())

    checkpoint = {
        "meta": meta,
        "state_dict": weights_to_cpu(model.state_dict()),
        "message_hub": to_cpu(runner.message_hub.state_dict()),
    }
    if save_optimizer:
        if not isinstance(runner.optim_wrapper, OptimWrapper):
            raise TypeError(
                "self.optim_wrapper should be an `OptimWrapper` or `OptimWrapperDict` "
                f"instance, but got {runner.optim_wrapper}"
            )
        checkpoint["optimizer"] = to_cpu(runner.optim_wrapper.state_dict())
    if save_param_scheduler and runner.param_schedulers is None:
        runner.logger.warning(
            "`save_param_scheduler` is True but `self.param_schedulers` is None, so skip "
            "saving parameter schedulers"
        )
        save_param_scheduler = False
    if save_param_scheduler:
        schedulers = runner.param_schedulers
        if isinstance(schedulers, dict):
            checkpoint["param_schedulers"] = {
                name: [s.state_dict() for s in group] for name, group in schedulers.items()
            }
        else:
            checkpoint["param_schedulers"] = [s.state_dict() for s in schedulers]
    runner.call_hook("before_save_checkpoint", checkpoint=checkpoint)
    return checkpoint


# -- the message hub ----------------------------------------------------------------------


def make_current_message_hub(hub) -> None:
    """Make ``hub`` (an instance of a ``MessageHub`` subclass, which ``ManagerMixin`` keeps
    in the subclass's own registry) what ``MessageHub.get_current_instance()`` returns:
    the latest entry of ``MessageHub``'s private ``_instance_dict``."""
    instances = MessageHub._instance_dict
    instances.pop(hub.instance_name, None)
    instances[hub.instance_name] = hub


def scalar_history(hub, key: str):
    """``MessageHub.get_scalar``, reading the private ``_log_scalars`` instead of the
    ``log_scalars`` property (which ``CardMessageHub`` makes flush everything pending)."""
    if key not in hub._log_scalars:
        raise KeyError(
            f"{key} is not found in Messagehub.log_buffers: instance name is: {hub.instance_name}"
        )
    return hub._log_scalars[key]


def history_statistics() -> set:
    """The names of ``HistoryBuffer``'s statistics methods (the built-in four and those
    registered with ``HistoryBuffer.register_statistics``): its private
    ``_statistics_methods``."""
    return set(HistoryBuffer._statistics_methods)


# -- distributed set-up -----------------------------------------------------------------

#: mmengine's ``init_dist`` helpers (private): a failure inside one of them is stock
#: mmengine setting up a CUDA device.
STOCK_INIT_DIST = ("_init_dist_pytorch", "_init_dist_slurm", "_init_dist_mpi")


def failed_in_stock_init_dist(tb) -> bool:
    """Whether the traceback ``tb`` passes through mmengine's own ``init_dist`` helpers."""
    return any(frame.name in STOCK_INIT_DIST for frame in traceback.extract_tb(tb))


def _require(launcher: str, names) -> None:
    missing = [n for n in names if n not in os.environ]
    if missing:
        how = {"slurm": "srun", "mpi": "mpirun"}[launcher]
        raise GCUError(
            f"--launcher {launcher} but {', '.join(missing)} is not set: start the job "
            f"with {how} (tools/slurm_train.sh for slurm), or use --launcher pytorch "
            "under torchrun."
        )


def set_slurm_env(port: Optional[int]) -> None:
    """The environment half of ``_init_dist_slurm`` (rank, world, master address and port
    from Slurm's variables), without its ``torch.cuda.set_device``; a missing variable is
    named instead of a ``KeyError``."""
    _require("slurm", ("SLURM_PROCID", "SLURM_NTASKS"))
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ.setdefault("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))
    if port is not None:
        os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("MASTER_PORT", "29500")
    if "MASTER_ADDR" not in os.environ:
        _require("slurm", ("SLURM_NODELIST",))
        nodes = os.environ["SLURM_NODELIST"]
        os.environ["MASTER_ADDR"] = subprocess.getoutput(
            f"scontrol show hostname {nodes} | head -n1"
        )


def set_mpi_env(port: Optional[int]) -> None:
    """The environment half of ``_init_dist_mpi`` (Open MPI's variables), without its
    ``torch.cuda.set_device``."""
    _require("mpi", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"))
    os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
    os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    os.environ["LOCAL_RANK"] = os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]
    if port is not None:
        os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
