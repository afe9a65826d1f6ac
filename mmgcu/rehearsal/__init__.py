"""Rehearsal: a user's own config on simulated cards before the T20 sees it.

:func:`rehearse` runs the config as a real job does (stock ``tools/train.py`` under
torchrun, the config's runner) on simulated cards, with offline synthetic data and local
weights only (:mod:`.plan`, :mod:`.data`), through build, placement, wrap, training,
validation, checkpoint and resume (:mod:`.jobs`); :class:`~.hook.RehearsalHook` records
each rank, and :mod:`.report` turns that into one :class:`~.report.Report`
(:func:`format_report` prints it, as ``mmgcu rehearse`` does).
"""

from .errors import RehearsalError
from .report import Report
from .run import rehearse, run_rehearsal
from .text import format_report

__all__ = ["RehearsalError", "Report", "format_report", "rehearse", "run_rehearsal"]
