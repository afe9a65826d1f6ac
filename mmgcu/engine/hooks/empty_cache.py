"""``GCUEmptyCacheHook``: mmengine's :class:`EmptyCacheHook` for GCU cards."""

from mmengine.hooks import EmptyCacheHook
from mmengine.registry import HOOKS

from ...binding import CardBound
from ...compat.mmengine import EmptyCacheHookPoints
from ...counterparts import replaces


@HOOKS.register_module()
@replaces(
    EmptyCacheHook,
    why="it empties only CUDA's cache",
    does={
        "caches_memory": "it empties the card's cache",
        "*": "the card has no cache to empty (torch_gcu 1.x), so it says so once and does nothing",
    },
)
class GCUEmptyCacheHook(CardBound, EmptyCacheHookPoints):
    """Release cached card memory, with :class:`EmptyCacheHook`'s options
    (``before_epoch``, ``after_epoch``, ``after_iter``). torch_gcu 1.x has no
    ``empty_cache``; there the hook says so once and does nothing. Off a GCU card
    (another runner, the CPU, CUDA) it is mmengine's hook."""

    off_card = "acts as mmengine's EmptyCacheHook"
    _told = False

    def _empty(self, accelerator, runner) -> None:
        if not accelerator.empty_cache() and not self._told:
            self._told = True
            runner.logger.info(
                "GCUEmptyCacheHook: %s has no cache to empty; the hook does nothing",
                accelerator.description,
            )

    def empty_on_card(self, runner, asked: bool) -> bool:
        accelerator = self.card_accelerator()
        if accelerator is None:
            return False
        if asked:
            self._empty(accelerator, runner)
        return True
