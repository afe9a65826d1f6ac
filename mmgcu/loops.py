"""Validation and test loops whose ``fp16=True`` autocasts on the GCU card.

Stock loops autocast on ``mmengine.device.get_device()``, which is ``'cpu'`` on a GCU
host, so their fp16 would silently run in fp32 on the card.
"""

import contextlib

import torch
from mmengine.registry import LOOPS
from mmengine.runner import TestLoop, ValLoop
from mmengine.runner.loops import _update_losses

from .device import get_backend


def _autocast(enabled: bool):
    return get_backend().autocast(torch.float16) if enabled else contextlib.nullcontext()


@LOOPS.register_module()
class GCUValLoop(ValLoop):
    """:class:`ValLoop` with ``fp16`` autocast on the card."""

    @torch.no_grad()
    def run_iter(self, idx, data_batch) -> None:
        self.runner.call_hook("before_val_iter", batch_idx=idx, data_batch=data_batch)
        with _autocast(self.fp16):
            outputs = self.runner.model.val_step(data_batch)
        outputs, self.val_loss = _update_losses(outputs, self.val_loss)
        self.evaluator.process(data_samples=outputs, data_batch=data_batch)
        self.runner.call_hook(
            "after_val_iter", batch_idx=idx, data_batch=data_batch, outputs=outputs
        )


@LOOPS.register_module()
class GCUTestLoop(TestLoop):
    """:class:`TestLoop` with ``fp16`` autocast on the card."""

    @torch.no_grad()
    def run_iter(self, idx, data_batch) -> None:
        self.runner.call_hook("before_test_iter", batch_idx=idx, data_batch=data_batch)
        with _autocast(self.fp16):
            outputs = self.runner.model.test_step(data_batch)
        outputs, self.test_loss = _update_losses(outputs, self.test_loss)
        self.evaluator.process(data_samples=outputs, data_batch=data_batch)
        self.runner.call_hook(
            "after_test_iter", batch_idx=idx, data_batch=data_batch, outputs=outputs
        )
