"""``GCUDevicePlacementHook``: checks, once before the loop, that every rank is on its card.

This is seed 001's diagnostic (which patched ``mmengine/runner/runner.py``) built in: it
stops the run with one message on a wrong placement, instead of an obscure failure later.
"""

import logging
import socket

from mmengine.dist import all_gather_object, get_world_size
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from ..device import GCUError, get_backend, physical_card
from ..model.wrappers import misplaced


@HOOKS.register_module()
class GCUDevicePlacementHook(Hook):
    """Before the first train/val/test loop, check placement on every rank.

    Checks that every parameter and buffer is on this rank's card and that no two ranks
    share a physical card of a host (which also catches more ranks than cards); rank 0
    logs one line per rank. A single process on a node with more cards is warned that the rest idle.
    """

    priority = "VERY_HIGH"

    def __init__(self):
        self._checked = False

    def before_train(self, runner) -> None:
        self._check(runner)

    def before_val(self, runner) -> None:
        self._check(runner)

    def before_test(self, runner) -> None:
        self._check(runner)

    def _check(self, runner) -> None:
        if self._checked:
            return
        self._checked = True
        backend = get_backend()
        card = backend.current_device()
        device = backend.device(card)
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        wrong = misplaced(model, device)
        mine = dict(
            rank=runner.rank,
            host=socket.gethostname(),
            card=card,
            physical=physical_card(card),
            device=str(device),
            cards=backend.device_count(),
            misplaced=[f"{n} on {d}" for n, d in wrong[:5]],
            n_misplaced=len(wrong),
        )
        everyone = all_gather_object(mine) if get_world_size() > 1 else [mine]
        self._verify(everyone)
        lines = [
            f"rank {r['rank']} on {r['host']}: {r['device']} (card {r['card']} of {r['cards']}"
            + (f", physical card {r['physical']})" if r["physical"] != str(r["card"]) else ")")
            for r in everyone
        ]
        runner.logger.info("mmgcu placement (%s):\n    %s", backend.name, "\n    ".join(lines))
        if len(everyone) == 1 and backend.is_gcu and mine["cards"] > 1:
            n = mine["cards"]
            print_log(
                f"using 1 of {n} GCUs: this is a single process, so {n - 1} card(s) idle. "
                f"Launch one process per card: tools/dist_train.sh CONFIG {n}, or "
                f"torchrun --nproc_per_node={n} tools/train.py CONFIG --launcher pytorch",
                logger="current",
                level=logging.WARNING,
            )

    @staticmethod
    def _verify(everyone) -> None:
        for r in everyone:
            if r["n_misplaced"]:
                raise GCUError(
                    f"rank {r['rank']}: {r['n_misplaced']} parameter(s)/buffer(s) are not on "
                    f"its card {r['device']}: {', '.join(r['misplaced'])}. Something moved "
                    "them or created them after the runner placed the model; create "
                    "parameters in __init__ and let GCURunner move the model."
                )
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
