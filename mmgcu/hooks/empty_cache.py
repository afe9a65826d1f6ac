"""``GCUEmptyCacheHook``: mmengine's :class:`EmptyCacheHook` for GCU cards."""

from mmengine.hooks import EmptyCacheHook
from mmengine.registry import HOOKS

from ..counterparts import replaces


@HOOKS.register_module()
@replaces(EmptyCacheHook, why="it empties only CUDA's cache")
class GCUEmptyCacheHook(EmptyCacheHook):
    """Release cached card memory, with :class:`EmptyCacheHook`'s options
    (``before_epoch``, ``after_epoch``, ``after_iter``). torch_gcu 1.x has no
    ``empty_cache``; there the hook says so once and does nothing."""

    _told = False

    def _empty(self, runner) -> None:
        if not runner.accelerator.empty_cache() and not self._told:
            self._told = True
            runner.logger.info(
                "GCUEmptyCacheHook: %s has no cache to empty; the hook does nothing",
                runner.accelerator.description,
            )

    def _after_iter(self, runner, batch_idx, data_batch=None, outputs=None, mode="train"):
        if self._do_after_iter:
            self._empty(runner)

    def _before_epoch(self, runner, mode="train"):
        if self._do_before_epoch:
            self._empty(runner)

    def _after_epoch(self, runner, mode="train"):
        if self._do_after_epoch:
            self._empty(runner)
