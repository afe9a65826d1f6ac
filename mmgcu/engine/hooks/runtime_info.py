"""``GCURuntimeInfoHook``: mmengine's :class:`RuntimeInfoHook` for scalars kept on the card.

On GCU cards ``GCURunner``'s message hub is a :class:`~mmgcu.engine.message_hub.CardMessageHub`,
which keeps the losses of each step on the card until something reads them. This hook
hands them over where stock mmengine would already have them: after the first step of a
new scalar (so the log keeps mmengine's order of keys), at the end of every epoch and of
training, and before validation and testing. It also ends each iteration on the card
(``Accelerator.finish_step``): on a lazy card the iteration's graph runs then, with the
hub's stack of the iteration's scalars among its outputs, so that the log's read of them is
a transfer and the step one graph.
"""

from mmengine.hooks import RuntimeInfoHook
from mmengine.registry import HOOKS

from ...binding import CardBound
from ...counterparts import replaces
from ..message_hub import CardMessageHub


def _flush(runner) -> None:
    if isinstance(runner.message_hub, CardMessageHub):
        runner.message_hub.flush()


@HOOKS.register_module()
@replaces(
    RuntimeInfoHook,
    why="it reads every logged loss of every step from the card (.item()), a host wait each",
    does="it keeps the step's losses on the card and reads them once per log line",
)
class GCURuntimeInfoHook(CardBound, RuntimeInfoHook):
    """:class:`RuntimeInfoHook` whose step scalars reach the message hub in one transfer
    per log line (see :mod:`mmgcu.engine.message_hub`), and that ends each iteration on
    the card it is bound to."""

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        super().after_train_iter(runner, batch_idx, data_batch, outputs)
        hub = runner.message_hub
        card_hub = isinstance(hub, CardMessageHub)
        accelerator = self.card_accelerator()
        if accelerator is not None:
            # a lazy card's graph outputs the iteration's scalars; an eager card's log
            # reads them in one stack per log line
            accelerator.finish_step(hub.seal() if card_hub and accelerator.lazy else ())
        if card_hub and hub.has_new_keys():
            hub.flush()

    def after_train_epoch(self, runner) -> None:
        _flush(runner)

    def after_train(self, runner) -> None:
        _flush(runner)
        super().after_train(runner)

    def before_val(self, runner) -> None:
        _flush(runner)
        super().before_val(runner)

    def before_test(self, runner) -> None:
        _flush(runner)
        super().before_test(runner)
