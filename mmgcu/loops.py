"""Validation and test loops whose ``fp16=True`` autocasts on the GCU card.

Stock loops autocast on ``mmengine.device.get_device()``, which is ``'cpu'`` on a GCU
host, so their fp16 would silently run in fp32 on the card. These run the stock
``run_iter`` inside the card's autocast, with the stock (CPU) autocast turned off.
"""

import contextlib

import torch
from mmengine.registry import LOOPS
from mmengine.runner import TestLoop, ValLoop

from .counterparts import replaces

_WHY = "its fp16 autocasts on get_device(), the CPU of a GCU host"


class CardAutocast:
    """``fp16`` taken from the stock loop and applied on the runner's card instead."""

    def __init__(self, *args, fp16: bool = False, **kwargs):
        super().__init__(*args, fp16=False, **kwargs)
        self.card_fp16 = fp16
        self.step = None

    def _card_autocast(self):
        if not self.card_fp16:
            return contextlib.nullcontext()
        return self.runner.accelerator.autocast(torch.float16)

    def run(self):
        self.step = None
        return super().run()

    def run_iter(self, idx, data_batch) -> None:
        self.step = idx  # the batch running now, which the watchdog's thread reads
        with self._card_autocast():
            super().run_iter(idx, data_batch)


@LOOPS.register_module()
@replaces(ValLoop, why=_WHY)
class GCUValLoop(CardAutocast, ValLoop):
    """:class:`ValLoop` with ``fp16`` autocast on the card."""


@LOOPS.register_module()
@replaces(TestLoop, why=_WHY)
class GCUTestLoop(CardAutocast, TestLoop):
    """:class:`TestLoop` with ``fp16`` autocast on the card."""
