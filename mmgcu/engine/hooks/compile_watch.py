"""``GCUCompileWatchHook``: a job on a lazy card that watches its own compiles.

A torch_gcu 1.x card compiles every graph it has not seen, for minutes on a vision model.
After warm-up a training step should compile nothing; a job whose compiles keep growing is
running at a fraction of the card's pace, and nothing else in the log says so. This hook
reads the card's compile count (``Accelerator.compiled_graphs``: torch_gcu's metrics report,
a host-side counter that waits for nothing) every ``interval`` training iterations and after
each validation, and warns once per phase, as torch_xla's ``PT_XLA_DEBUG`` warns "CompileTime
too frequent", naming the likely cause and the command that finds the line. Where the card
reports no count (or its report has another format), it stays silent.
"""

import logging
from typing import Optional

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from ...binding import CardBound

#: Training iterations that compile by design: the first, and the second where the
#: optimizer made its state in the first.
WARM_UP = 2


@HOOKS.register_module()
class GCUCompileWatchHook(CardBound, Hook):
    """Warns once when a lazy card keeps compiling after warm-up (training) or compiles
    graphs for a good part of the images of a validation.

    Args:
        interval: training iterations per reading (50, mmseg's log interval).
        windows: consecutive readings with new compiles before it warns in training.
        val_images_per_compile: a validation that compiles a graph for every this many
            images or fewer, more than ``val_graphs`` graphs in all, is warned about.
        val_graphs: graphs a validation may compile without a word (its shape buckets).
    """

    priority = "VERY_LOW"

    def __init__(self, interval=50, windows=2, val_images_per_compile=4, val_graphs=16):
        self.interval = interval
        self.windows = windows
        self.val_images_per_compile = val_images_per_compile
        self.val_graphs = val_graphs
        self._last: Optional[int] = None
        self._growing = 0
        self._said = set()
        self._val_start: Optional[int] = None
        self._val_images = 0

    def _compiles(self) -> Optional[int]:
        accelerator = self.accelerator
        if accelerator is None or not accelerator.lazy:
            return None
        return accelerator.compiled_graphs()

    def _warn(self, phase: str, text: str) -> None:
        if phase not in self._said:
            self._said.add(phase)
            print_log(f"mmgcu: {text}", logger="current", level=logging.WARNING)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        # every interval, as the logger reads: the first reading is after the warm-up
        if not self.every_n_train_iters(runner, self.interval) or runner.iter + 1 < WARM_UP:
            return
        now = self._compiles()
        if now is None:
            return
        if self._last is not None:
            self._growing = self._growing + 1 if now > self._last else 0
            if self._growing >= self.windows:
                self._warn(
                    "train",
                    f"the card compiled {now - self._last} graph(s) in the last {self.interval} "
                    f"training iterations, and it keeps compiling after warm-up ({now} graphs "
                    "in all): every new graph takes minutes. Likely causes: input shapes that "
                    "change (crops not padded to one size; a short last batch: drop_last=True) "
                    "or an op whose output shape follows the data (masked indexing, nonzero). "
                    "`mmgcu rehearse CONFIG` names the line.",
                )
        self._last = now

    def before_val_epoch(self, runner) -> None:
        self._val_start = self._compiles()
        self._val_images = 0

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self._val_images += len(outputs or ())

    def after_val_epoch(self, runner, metrics=None) -> None:
        now = self._compiles()
        if now is None or self._val_start is None:
            return
        compiled = now - self._val_start
        many = compiled * self.val_images_per_compile >= self._val_images
        if compiled > self.val_graphs and many:
            self._warn(
                "val",
                f"validation compiled {compiled} graphs for {self._val_images} images: about "
                "one per image size. Pad the inputs to a few sizes "
                "(model.data_preprocessor.test_cfg = dict(size=(H, W))), or let mmgcu pad them "
                "to its shape buckets (SegDataPreProcessor under GCURunner does). `mmgcu "
                "rehearse CONFIG` shows the shapes.",
            )
