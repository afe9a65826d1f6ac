"""Rehearsal: a user's own config on simulated cards before the T20 sees it.

:func:`rehearse` runs the config as a real job does (stock ``tools/train.py`` under
torchrun, the config's runner) on simulated cards, with offline synthetic data and local
weights only (:mod:`.plan`, :mod:`.data`), through build, placement, wrap, training,
validation, checkpoint and resume; :class:`~.hook.RehearsalHook` records each rank, and
:mod:`.report` turns that into one report (``mmgcu rehearse`` prints it).
"""

from .report import format_report
from .run import rehearse

__all__ = ["format_report", "rehearse"]
