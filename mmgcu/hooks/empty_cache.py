"""``GCUEmptyCacheHook``: mmengine's :class:`EmptyCacheHook` for GCU cards."""

from mmengine.hooks import EmptyCacheHook
from mmengine.registry import HOOKS

from ..device import get_backend


@HOOKS.register_module()
class GCUEmptyCacheHook(EmptyCacheHook):
    """Release cached card memory, with :class:`EmptyCacheHook`'s options.

    Stock ``EmptyCacheHook`` empties only CUDA's cache; ``GCURunner`` maps it to this on a
    GCU. Args: ``before_epoch``, ``after_epoch``, ``after_iter`` as in mmengine.
    """

    def _after_iter(self, runner, batch_idx, data_batch=None, outputs=None, mode="train"):
        if self._do_after_iter:
            get_backend().empty_cache()

    def _before_epoch(self, runner, mode="train"):
        if self._do_before_epoch:
            get_backend().empty_cache()

    def _after_epoch(self, runner, mode="train"):
        if self._do_after_epoch:
            get_backend().empty_cache()
