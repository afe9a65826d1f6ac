"""How mmgcu's hooks, loops, log processor and optimizer wrappers get their card:
``GCURunner`` binds a :class:`Binding` (its accelerator, model and message hub) to each one
it builds (:meth:`CardBound.bind`); nothing reads them from the runner.

A config that inherits ``configs/_base_/gcu_runtime.py`` names ``GCULogProcessor``, and a
stock tool that builds mmengine's own ``Runner`` whatever ``runner_type`` says (mmseg
1.2.2's ``tools/test.py``) builds it too. Such an object has no accelerator. Unbound, or
bound to a device that is not a GCU card (a run on the CPU or CUDA), a GCU class does what
its stock mmengine class does, and one log line per process says so.
"""

import logging
from typing import NamedTuple, Optional, Set

import torch
from mmengine.logging import MessageHub, print_log

from .device import Accelerator

#: The reasons already logged in this process ("unbound", or a device kind).
_said: Set[str] = set()


class Binding(NamedTuple):
    """What ``GCURunner`` gives each GCU object it builds.

    Attributes:
        accelerator: the runner's accelerator.
        model: the runner's model as it trains (wrapped), once built; an optimizer
            wrapper's step runs on it.
        message_hub: the runner's message hub, once built; an optimizer wrapper logs the
            gradient norm to it.
    """

    accelerator: Accelerator
    model: Optional[torch.nn.Module] = None
    message_hub: Optional[MessageHub] = None


class CardBound:
    """Mixin of the GCU classes that work on the accelerator ``GCURunner`` binds them to.

    Attributes:
        accelerator: the runner's accelerator; None when no ``GCURunner`` bound one.
    """

    #: What the class does without a GCU card, after its name in the log line.
    off_card = "acts as its stock mmengine class"
    accelerator: Optional[Accelerator] = None

    def bind(self, binding: Binding) -> None:
        """Work on ``binding.accelerator`` (``GCURunner`` calls this on what it builds; a
        class that needs more of the binding extends it)."""
        self.accelerator = binding.accelerator

    def card_accelerator(self) -> Optional[Accelerator]:
        """The bound accelerator when it drives GCU cards; else None, said once."""
        accelerator = self.accelerator
        if accelerator is not None and accelerator.is_gcu:
            return accelerator
        say_off_card(self, accelerator)
        return None

    def bound_accelerator(self) -> Optional[Accelerator]:
        """The bound accelerator of any kind; None, said once, when none was bound."""
        if self.accelerator is None:
            say_off_card(self, None)
        return self.accelerator


def say_off_card(obj, accelerator: Optional[Accelerator]) -> None:
    """Log, once per process and reason, that mmgcu's classes act as stock ones, and why."""
    key = "unbound" if accelerator is None else accelerator.kind
    if key in _said:
        return
    _said.add(key)
    name = type(obj).__name__
    if accelerator is None:
        print_log(
            f"mmgcu: {name} {obj.off_card}: it was not built by GCURunner, so it has no card "
            "(stock tools such as mmseg's tools/test.py build mmengine's Runner whatever "
            "runner_type says, and run on the CPU of a GCU host). mmgcu's other classes in "
            "this run do the same. To run on the cards, use a tool that honours runner_type "
            "(mmgcu test, tools/dist_test.sh, tools/train.py).",
            logger="current",
            level=logging.WARNING,
        )
        return
    print_log(
        f"mmgcu: {name} {obj.off_card}: this run is on {accelerator.kind} "
        f"({accelerator.description}), not on a GCU card; mmgcu's other classes in this run "
        "do the same.",
        logger="current",
    )
