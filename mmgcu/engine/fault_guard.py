"""``FaultGuard``: what keeps a multi-process run's failures bounded and named.

- Locks: a second job on the same cards or work dir stops before it writes anything
  (:mod:`mmgcu.runtime.locks`).
- The watchdog of a distributed run (:class:`~mmgcu.engine.hooks.watchdog.GCUWatchdogHook`):
  a rank that hangs ends the job in bounded time, and is named.
- One message for a fault every rank meets (a damaged checkpoint): rank 0's; the others
  wait for the launcher (:func:`~mmgcu.runtime.excepthook.stop_every_rank`).
- A rank whose collective lost a peer waits (bounded), so the launcher names the rank
  that failed first.

``GCURunner`` creates one in its ``__init__`` and starts it once its rank is known.
"""

import contextlib
import time

from ..device import Accelerator
from ..errors import GCUError
from ..runtime.dist import lost_peer
from ..runtime.excepthook import stop_every_rank
from ..runtime.locks import hold as hold_locks
from .hooks.watchdog import build_watchdog


class FaultGuard:
    """The locks, watchdog and failure endings of one run.

    Args:
        accelerator: the run's device kind (its cards are locked).
        env_cfg: the config's ``env_cfg`` (``watchdog``, ``dist_cfg.timeout``).
        distributed: whether the run has several ranks.

    Attributes:
        watchdog: the run's :class:`~mmgcu.engine.hooks.watchdog.GCUWatchdogHook`, or a
            :class:`~mmgcu.engine.hooks.watchdog.NoWatchdog` (one process, or
            ``env_cfg.watchdog=False``).
    """

    #: Seconds a rank whose collective lost a peer waits before it exits.
    peer_loss_grace_s = 10.0

    def __init__(self, accelerator: Accelerator, env_cfg: dict, distributed: bool):
        self.accelerator = accelerator
        self.distributed = distributed
        self.watchdog = build_watchdog(env_cfg, distributed)
        self.rank, self.world_size = 0, 1
        self.locks = None

    def start(self, rank: int, world_size: int, work_dir: str) -> None:
        """Take this rank's locks (a second job on these cards or work dir stops here)."""
        self.rank, self.world_size = rank, world_size
        self.locks = hold_locks(self.accelerator, rank, work_dir, self.distributed)

    def saving(self):
        """Context of rank 0 writing a checkpoint while the other ranks wait outside any
        collective (the watchdog gives it the slow bound)."""
        return self.watchdog.saving()

    @contextlib.contextmanager
    def said_once(self):
        """A :class:`GCUError` that every rank meets is said once, by rank 0."""
        try:
            yield
        except GCUError as e:
            if self.rank != 0:  # rank 0 names it; this rank only waits for the launcher
                self.watchdog.stand_down()
            stop_every_rank(str(e), self.rank, self.world_size, self.peer_loss_grace_s)

    @contextlib.contextmanager
    def failed_peer_first(self, logger):
        """Let the rank that failed first be the one the launcher reports.

        When a rank fails, its peers' collectives fail as soon as its connections close,
        while it is still tearing down; a peer that exits first is what torchrun then
        names as the root cause. A rank whose collective lost a peer says so and waits
        (bounded) so the launcher sees the failed rank exit first and stops the job.
        """
        try:
            yield
        except Exception as exc:
            if not (self.distributed and lost_peer(exc)):
                raise
            self.watchdog.explain(exc)  # a peer that hung: named
            self.watchdog.stand_down()  # the wait below is not a hang of this rank
            logger.error(
                "rank %d: a collective failed because another rank stopped (%s: %s); "
                "that rank's error is the cause. Waiting up to %.0f s for the launcher "
                "to stop the job.",
                self.rank,
                type(exc).__name__,
                (str(exc).splitlines() or [""])[0][:200],
                self.peer_loss_grace_s,
            )
            time.sleep(self.peer_loss_grace_s)
            raise
