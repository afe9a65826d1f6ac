"""A stock mmengine ``Runner`` whose model is on simulated card 0: the peer of ``GCURunner``
in the ``overhead`` section's simulated-card pairs (``custom_imports`` of those runs).

Stock ``Runner.wrap_model`` puts the model on ``get_device()``, the CPU of a GCU host; this
subclass then moves it to ``gcu:0`` (one process, no DDP). Everything else is stock: the
``OptimWrapper``, the ``LogProcessor``, the ``MessageHub``, the hooks.
"""

from mmengine.registry import RUNNERS
from mmengine.runner import Runner


@RUNNERS.register_module()
class StockRunnerOnCard(Runner):
    def wrap_model(self, model_wrapper_cfg, model):
        if self.distributed:
            raise RuntimeError("StockRunnerOnCard is a one-process peer: no DDP")
        return super().wrap_model(model_wrapper_cfg, model).to("gcu:0")
