"""``GCUDevicePlacementHook``: before the first loop, every rank is on its own card.

It stops the run with one message on a wrong placement (instead of an obscure failure
later, or a patch to ``mmengine/runner/runner.py`` to print devices), and logs what mmgcu
set up: the accelerator, each rank's card, the process groups and precision. It checks
against the accelerator ``GCURunner`` binds to it; built by another runner, it has none and
does nothing.
"""

import logging
import socket

import torch
from mmengine.dist import all_gather_object, get_world_size
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper, OptimWrapperDict
from mmengine.registry import HOOKS

from ...binding import CardBound
from ...device import physical_card
from ...errors import GCUError
from ...model.placement import misplaced, misplaced_message, watch_late_parameters
from ...model.sync_bn import GCUSyncBatchNorm


@HOOKS.register_module()
class GCUDevicePlacementHook(CardBound, Hook):
    """Before the first train/val/test loop, check placement on every rank.

    Checks that every parameter and buffer is on this rank's card and that no two ranks
    share a physical card of a host (which also catches more ranks than cards); rank 0
    logs one line per rank. A single process on a node with more cards is warned that
    the rest idle. Before training, it also arms a check that runs once, at the end of the
    first forward pass, for parameters born in it.
    """

    priority = "VERY_HIGH"
    off_card = "does nothing"

    def __init__(self):
        self._checked = False

    def before_train(self, runner) -> None:
        self._check(runner)
        accelerator = self.accelerator
        if accelerator is not None:
            model = runner.model.module if is_model_wrapper(runner.model) else runner.model
            device = accelerator.device(accelerator.current_device())
            watch_late_parameters(model, device, lambda: held(runner))

    def before_val(self, runner) -> None:
        self._check(runner)

    def before_test(self, runner) -> None:
        self._check(runner)

    def _check(self, runner) -> None:
        if self._checked:
            return
        self._checked = True
        accelerator = self.bound_accelerator()
        if accelerator is None:
            return
        card = accelerator.current_device()
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        wrong = misplaced(model, accelerator.device(card))
        mine = dict(
            rank=runner.rank,
            host=socket.gethostname(),
            card=card,
            physical=physical_card(card),
            device=str(accelerator.device(card)),
            cards=accelerator.device_count(),
            misplaced=[(name, str(dev)) for name, dev in wrong],
        )
        everyone = all_gather_object(mine) if get_world_size() > 1 else [mine]
        verify(everyone)
        runner.logger.info(summary(accelerator, runner, everyone))
        if len(everyone) == 1 and accelerator.is_gcu and mine["cards"] > 1:
            n = mine["cards"]
            print_log(
                f"using 1 of {n} GCUs: this is a single process, so {n - 1} card(s) idle. "
                f"Launch one process per card: tools/dist_train.sh CONFIG {n}, or "
                f"torchrun --nproc_per_node={n} tools/train.py CONFIG --launcher pytorch",
                logger="current",
                level=logging.WARNING,
            )


def held(runner) -> list:
    """The parameters the runner's optimizer(s) hold."""
    wrapper = runner.optim_wrapper
    wrappers = wrapper.values() if isinstance(wrapper, OptimWrapperDict) else [wrapper]
    return [
        p
        for w in wrappers
        if isinstance(w, OptimWrapper)
        for group in w.optimizer.param_groups
        for p in group["params"]
    ]


def verify(everyone) -> None:
    """Raise :class:`GCUError` for a misplaced tensor or two ranks on one card."""
    for r in everyone:
        if r["misplaced"]:
            raise GCUError(misplaced_message(f"rank {r['rank']}", r["device"], r["misplaced"]))
    # Keyed by physical card, this also catches more ranks than cards on a host.
    seen = {}
    for r in everyone:
        key = (r["host"], r["physical"])
        if key in seen:
            raise GCUError(
                f"ranks {seen[key]} and {r['rank']} both run on card {r['physical']} of "
                f"{r['host']}: two ranks on one card. Give each rank of a node its own "
                "LOCAL_RANK (torchrun and tools/dist_train.sh do), and give agents that "
                "share a host disjoint TOPS_VISIBLE_DEVICES."
            )
        seen[key] = r["rank"]


def _sync_bn(model) -> str:
    gcu = sum(isinstance(m, GCUSyncBatchNorm) and m.card_group is not None for m in model.modules())
    stock = sum(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules())
    if gcu:
        return f"SyncBN on {gcu} layer(s) (GCUSyncBatchNorm)"
    return f"SyncBN on {stock} layer(s) (torch)" if stock else "no SyncBN layer"


def summary(accelerator, runner, everyone) -> str:
    """What mmgcu set up, for the log: the accelerator, groups, precision, each rank's card."""
    model = runner.model.module if is_model_wrapper(runner.model) else runner.model
    facts = accelerator.summary()
    group = accelerator.card_group.name if accelerator.card_group else "none (one process)"
    optim = getattr(runner, "optim_wrapper", None)
    precision = type(optim).__name__ if optim is not None and not isinstance(optim, dict) else "-"
    cast = getattr(optim, "cast_dtype", None)
    if cast:  # AMP: its dtype, and what an overflowed step does (the card's default if unset)
        mode = getattr(optim, "overflow_step", None) or (accelerator.overflow_steps or ("-",))[0]
        precision += f" ({cast}, overflow step '{mode}')"
    simulated = "SIMULATED " if accelerator.simulated else ""
    lines = [
        f"mmgcu: {facts['kind']} ({simulated}{facts['description']}); card tensors over {group}; "
        f"{_sync_bn(model)}; optimizer wrapper {precision}; "
        f"memory column: {facts['memory']}",
    ]
    for r in everyone:
        physical = f", physical card {r['physical']}" if r["physical"] != str(r["card"]) else ""
        lines.append(
            f"    rank {r['rank']} on {r['host']}: {r['device']} (card {r['card']} of "
            f"{r['cards']}{physical})"
        )
    return "\n".join(lines)
