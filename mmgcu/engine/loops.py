"""Validation and test loops whose ``fp16=True`` autocasts on the GCU card.

Stock loops autocast on ``mmengine.device.get_device()``, which is ``'cpu'`` on a GCU
host, so their fp16 would silently run in fp32 on the card. On the card ``GCURunner``
binds to them, these run the stock ``run_iter`` inside the card's autocast, with the
stock (CPU) autocast turned off. Off a GCU card (another runner, the CPU, CUDA) they are
the stock loops.
"""

import contextlib

import torch
from mmengine.registry import LOOPS
from mmengine.runner import TestLoop, ValLoop

from ..binding import CardBound
from ..counterparts import replaces

_WHY = "its fp16 autocasts on get_device(), the CPU of a GCU host"
_DOES = "its fp16 autocasts on the card"
_UNSET = object()


class CardAutocast(CardBound):
    """``fp16`` taken from the stock loop and applied on the bound card instead."""

    off_card = "acts as mmengine's loop (fp16 autocasts on get_device())"

    def __init__(self, *args, fp16: bool = False, **kwargs):
        self._card = _UNSET
        super().__init__(*args, fp16=fp16, **kwargs)
        self.step = None

    @property
    def fp16(self) -> bool:
        """Whether the stock ``run_iter`` autocasts (on ``get_device()``): off a card only."""
        card = self.card_accelerator() if self._card is _UNSET else self._card
        return self.card_fp16 and card is None

    @fp16.setter
    def fp16(self, value: bool) -> None:
        self.card_fp16 = bool(value)  # the stock __init__ sets it

    def run(self):
        self.step = None
        # The card, looked up once per run (it may have been bound since the last one),
        # not once per iteration.
        self._card = self.card_accelerator()
        try:
            return super().run()
        finally:
            self._card = _UNSET

    def run_iter(self, idx, data_batch) -> None:
        self.step = idx  # the batch running now, which the watchdog's thread reads
        accelerator = self.card_accelerator() if self._card is _UNSET else self._card
        with contextlib.ExitStack() as stack:
            if self.card_fp16 and accelerator is not None:
                stack.enter_context(accelerator.autocast(torch.float16))
            super().run_iter(idx, data_batch)


@LOOPS.register_module()
@replaces(ValLoop, why=_WHY, does=_DOES)
class GCUValLoop(CardAutocast, ValLoop):
    """:class:`ValLoop` with ``fp16`` autocast on the card."""


@LOOPS.register_module()
@replaces(TestLoop, why=_WHY, does=_DOES)
class GCUTestLoop(CardAutocast, TestLoop):
    """:class:`TestLoop` with ``fp16`` autocast on the card."""
