"""``GCUStrategy``: how one run uses its cards (lightning's strategy, for mmengine).

It sets this rank's card and creates the process groups (before mmengine's own set-up
reads the rank), then places the model on the card and wraps it: mmcv's compiled ops that
no card can run replaced, SyncBN layers that synchronise over the card group, and the DDP
wrapper of the accelerator's kind with the card's device arguments. ``GCURunner`` creates
one and calls it from ``setup_env`` and ``wrap_model``.
"""

from typing import Optional

import torch
from mmengine.dist import is_distributed
from mmengine.logging import print_log
from mmengine.model import convert_sync_batchnorm, revert_sync_batchnorm
from mmengine.registry import MODEL_WRAPPERS

from ..counterparts import Counterparts
from ..device import Accelerator
from ..errors import GCUError
from ..model import (
    GCU1DistributedDataParallel,
    GCUDistributedDataParallel,
    GCUSyncBatchNorm,
    convert_gcu_mmcv_ops,
    convert_gcu_sync_batchnorm,
    revert_gcu_sync_batchnorm,
)
from ..model.placement import watch_first_batch
from ..model.whole_graph import keep_graph_whole
from ..model.wrappers import ddp_config, torch_ddp_names
from ..runtime.dist import init_distributed

_GCU_DDP = (GCUDistributedDataParallel, GCU1DistributedDataParallel)
_TORCH_DDP = torch.nn.parallel.DistributedDataParallel


class GCUStrategy:
    """Process groups and the wrapped model of one run on ``accelerator``.

    Args:
        accelerator: the device kind the run trains on.
        counterparts: resolves the config's DDP type to the accelerator's wrapper.
        launcher: mmengine's launcher (``'none'``, ``'pytorch'``, ``'slurm'``, ``'mpi'``).
    """

    def __init__(self, accelerator: Accelerator, counterparts: Counterparts, launcher="none"):
        self.accelerator = accelerator
        self.counterparts = counterparts
        self.launcher = launcher
        self.distributed = launcher != "none"

    @property
    def card(self) -> int:
        """This rank's card on its node: the accelerator's current card (its one source)."""
        return self.accelerator.current_device()

    # -- the process groups ---------------------------------------------------------------
    def setup(self, env_cfg: dict) -> dict:
        """Set this rank's card, then create (or adopt) the process groups; return
        ``env_cfg`` as mmengine's own set-up should see it."""
        if self.distributed and not is_distributed():
            dist_cfg = dict(env_cfg.get("dist_cfg", {}))
            backend = dist_cfg.pop("backend", None)
            init_distributed(self.accelerator, self.launcher, backend, **dist_cfg)
        elif self.distributed:  # the caller created the group
            self.accelerator.adopt_process_groups()
        else:
            self.accelerator.set_device(0)
        if env_cfg.get("cudnn_benchmark") and not self.accelerator.cudnn:
            env_cfg = {k: v for k, v in env_cfg.items() if k != "cudnn_benchmark"}
        return env_cfg

    # -- the model ----------------------------------------------------------------------
    def wrap(
        self,
        model: torch.nn.Module,
        model_wrapper_cfg: Optional[dict] = None,
        sync_bn: Optional[str] = None,
        find_unused_parameters: bool = False,
        whole_graph: bool = True,
    ) -> torch.nn.Module:
        """``model`` on this rank's card, wrapped in the accelerator's DDP when distributed.

        Args:
            model: the model, not yet wrapped.
            model_wrapper_cfg: the config's; None takes mmengine's defaults.
            sync_bn: the config's ``sync_bn`` (plain BN converted first, as in mmengine).
            find_unused_parameters: the config's, for mmengine's default wrapper cfg.
            whole_graph: on a lazy card, keep a stock mmseg model's step to one graph and
                its validation to a few shapes (the config's ``gcu_whole_graph``).
        """
        if self.accelerator.is_gcu:
            model = self._card_ops(model)
        if self.accelerator.lazy and whole_graph:
            self._whole_graph(model)
        device = self.accelerator.device(self.card)
        model = model.to(device)
        watch_first_batch(model, device)
        if not self.distributed:
            return revert_gcu_sync_batchnorm(revert_sync_batchnorm(model))
        model = self._sync_batchnorm(model, sync_bn)
        if model_wrapper_cfg is None:  # mmengine's defaults for a missing cfg
            model_wrapper_cfg = dict(
                broadcast_buffers=False, find_unused_parameters=find_unused_parameters
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

    def _whole_graph(self, model: torch.nn.Module) -> None:
        """On a lazy card, the changes that keep mmseg's step to one graph and its
        validation to a few graph shapes (:mod:`mmgcu.model.whole_graph`)."""
        changed = keep_graph_whole(model)
        if changed:
            print_log(
                "mmgcu: on a lazy card (XLA graphs) mmgcu changes: " + "; ".join(changed),
                logger="current",
            )

    def _wrapper_args(self, wrapper, model: torch.nn.Module) -> dict:
        if not isinstance(wrapper, type):  # an unknown name: mmengine's registry says so
            return dict(module=model)
        if issubclass(wrapper, _GCU_DDP):
            return dict(module=model, accelerator=self.accelerator)
        if issubclass(wrapper, _TORCH_DDP):
            self._check_torch_ddp(wrapper)
            return dict(module=model, **self.accelerator.ddp_kwargs(self.card))
        return dict(module=model)

    def _check_torch_ddp(self, wrapper: type) -> None:
        """Refuse a config's torch DDP class where the accelerator's DDP is not torch's
        (torch_gcu 1.x's is its own, over ECCL)."""
        vendor = self.accelerator.vendor_ddp()
        if issubclass(vendor, _TORCH_DDP):
            return
        (fitting,) = [w for w in _GCU_DDP if w.fits(self.accelerator)]
        raise GCUError(
            f"model_wrapper_cfg.type={wrapper.__name__} is a torch DistributedDataParallel, "
            f"which cannot train on {self.accelerator.description} (its DDP is "
            f"{vendor.__module__}.{vendor.__qualname__}). Remove model_wrapper_cfg.type: "
            f"mmgcu builds {fitting.__name__}."
        )

    def _sync_batchnorm(self, model: torch.nn.Module, sync_bn: Optional[str]) -> torch.nn.Module:
        """SyncBN layers that synchronise on this device: torch's own on CUDA; elsewhere
        :class:`GCUSyncBatchNorm` over the card group (no GCU has torch's SyncBN kernels,
        and the CPU has none either)."""
        if sync_bn is not None:
            model = convert_sync_batchnorm(model, sync_bn)
        if self.accelerator.torch_sync_bn:
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
