"""Launching a job on this node's cards: what ``mmgcu train``/``test``, ``tools/dist_*.sh``
and ``mmgcu rehearse`` share.

- :mod:`.torchrun`: the torchrun command of a job, its workers' environment, and
  :class:`LaunchError`, what is refused before torchrun starts;
- :mod:`.cards`: the cards of this node (visible-devices variables, the simulator's
  ``MMGCU_SIMULATE`` and its hardware, ``efsmi``), counted without a card;
- :mod:`.ports`: a free port for a job's own store, and whether a given one is taken;
- :mod:`.configs`: the configs shipped with mmgcu;
- :mod:`.preflight`: what keeps a config off the cards, said before any process starts.

Standard library only (mmengine is imported inside :func:`.preflight.config_problem`
alone), and its modules import nothing of mmgcu but each other: ``tools/dist_*.sh`` run
``mmgcu/cli/launch.py`` as a script, without the mmgcu package (whose import loads torch
and mmengine), and it loads this package by its path.
"""

from . import cards, configs, ports, preflight, torchrun
from .torchrun import LaunchError

__all__ = ["LaunchError", "cards", "configs", "ports", "preflight", "torchrun"]
