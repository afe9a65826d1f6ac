"""mmengine's DDP wrapper contract on GCU cards, one class per kind of vendor DDP.

- :class:`GCUDistributedDataParallel` is an :class:`MMDistributedDataParallel` (torch's
  DDP) for torch_gcu 2.x, CUDA and the CPU, given this rank's card.
- :class:`GCU1DistributedDataParallel` is for torch_gcu 1.x, whose DDP is an
  ``nn.Module`` with a constructor of its own, not torch's DDP: no class can be both it
  and :class:`MMDistributedDataParallel`. So this wrapper *holds* the vendor DDP (``.ddp``)
  and gives mmengine the wrapper contract (``.module``, ``train_step``, ``val_step``,
  ``test_step``, ``no_sync``), reusing :class:`MMDistributedDataParallel`'s own
  functions for the steps rather than copies of them.

``GCURunner`` builds the accelerator's wrapper wherever a config names mmengine's or
torch's DDP, and checks the config's device arguments first (:func:`ddp_config`).
"""

import inspect

import torch
from mmengine.dist import get_rank
from mmengine.model import MMDistributedDataParallel
from mmengine.registry import MODEL_WRAPPERS

from ..compat.mmengine import MMDDPSteps
from ..counterparts import replaces
from ..device import Accelerator
from ..errors import GCUError
from .placement import check_placement

_STOCK_DDP = (MMDistributedDataParallel, torch.nn.parallel.DistributedDataParallel)


def ddp_config(cfg: dict, accelerator: Accelerator, card: int) -> dict:
    """``model_wrapper_cfg`` checked for this rank: device arguments are mmgcu's to set.

    One config serves every rank, so no ``device_ids``/``output_device`` value in it can
    name every rank's card; ``None`` is what mmengine's own default would leave, and goes.
    """
    cfg = dict(cfg)
    for key in ("device_ids", "output_device"):
        given = cfg.pop(key, None)
        if given is not None:
            raise GCUError(
                f"model_wrapper_cfg.{key}={given}, but each rank trains on its own card (this "
                f"one on {accelerator.device(card)}), which one config value cannot name for "
                f"every rank. Remove {key} from model_wrapper_cfg: mmgcu sets it for every rank."
            )
    return cfg


def torch_ddp_names(cfg: dict) -> dict:
    """``broadcast_buffers`` as ``forward_sync_buffers`` where torch's DDP takes the new name.

    mmengine's default and gcu_runtime.py pass ``broadcast_buffers=False`` (no buffer
    broadcast each forward); torch >= 2.13 deprecates that name with a FutureWarning per
    rank. Its replacement still syncs buffers once at construction, which changes nothing
    here: every rank builds the model from the same seed.
    """
    takes = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    if "broadcast_buffers" in cfg and "forward_sync_buffers" in takes:
        cfg = dict(cfg)
        cfg["forward_sync_buffers"] = cfg.pop("broadcast_buffers")
    return cfg


@MODEL_WRAPPERS.register_module()
@replaces(
    *_STOCK_DDP,
    why="the stock wrapper leaves the model where get_device() points (the CPU on a GCU "
    "host) and gives DDP device_ids of its own",
    does="it wraps the model on this rank's card, with that card's device_ids and group",
    everywhere=True,
)
class GCUDistributedDataParallel(MMDistributedDataParallel):
    """:class:`MMDistributedDataParallel` on this rank's card (torch_gcu 2.x, CUDA, CPU).

    Args:
        module: the model, already on this rank's card (``GCURunner.wrap_model`` moves it).
        accelerator: the runner's accelerator; it names the card's DDP arguments.
        detect_anomalous_params: see :class:`MMDistributedDataParallel`.
        **kwargs: DDP options (``broadcast_buffers``, ``bucket_cap_mb``, ...).
    """

    @classmethod
    def fits(cls, accelerator: Accelerator) -> bool:
        """Whether this wrapper is the one for ``accelerator``: its DDP is torch's."""
        return issubclass(accelerator.vendor_ddp(), torch.nn.parallel.DistributedDataParallel)

    def __init__(self, module, accelerator: Accelerator, detect_anomalous_params=False, **kwargs):
        card = accelerator.current_device()
        check_placement(module, accelerator.device(card), f"rank {get_rank()}")
        kwargs.update(accelerator.ddp_kwargs(card))
        super().__init__(module, detect_anomalous_params=detect_anomalous_params, **kwargs)


@MODEL_WRAPPERS.register_module()
@replaces(
    *_STOCK_DDP,
    why="torch_gcu 1.x trains with its own DDP (not torch's), on this rank's card and ECCL group",
    does="it wraps the model in torch_gcu's DistributedDataParallel on this rank's card and "
    "ECCL group",
    everywhere=True,
)
class GCU1DistributedDataParallel(MMDDPSteps, torch.nn.Module):
    """mmengine's wrapper contract around torch_gcu 1.x's DistributedDataParallel.

    Args:
        module: the model, already on this rank's card.
        accelerator: the runner's torch_gcu 1.x accelerator; it names the vendor DDP, the
            card (``device_ids=[card]``) and the ECCL group.
        detect_anomalous_params: see :class:`MMDistributedDataParallel`.
        **kwargs: the vendor DDP's options (``broadcast_buffers``, ``bucket_cap_mb``,
            ``find_unused_parameters``, ``gradient_as_bucket_view``).
    """

    @classmethod
    def fits(cls, accelerator: Accelerator) -> bool:
        """Whether this wrapper is the one for ``accelerator``: its DDP is not torch's."""
        return not GCUDistributedDataParallel.fits(accelerator)

    def __init__(self, module, accelerator: Accelerator, detect_anomalous_params=False, **kwargs):
        super().__init__()
        card = accelerator.current_device()
        check_placement(module, accelerator.device(card), f"rank {get_rank()}")
        kwargs.update(accelerator.ddp_kwargs(card))
        self.ddp = accelerator.vendor_ddp()(module, **kwargs)
        self.detect_anomalous_params = detect_anomalous_params

    @property
    def module(self) -> torch.nn.Module:
        return self.ddp.module

    def forward(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def no_sync(self):
        """Skip the gradient all-reduce (gradient accumulation), as torch's DDP does."""
        return self.ddp.no_sync()
