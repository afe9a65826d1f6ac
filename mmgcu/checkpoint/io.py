"""``GCUCheckpointIO``: how ``GCURunner`` writes, checks and loads checkpoint files
(lightning's checkpoint I/O, for mmengine).

- Writing: rank 0 writes under a temporary name, fsyncs, then renames
  (:func:`~mmgcu.checkpoint.files.save_atomically`); a remote backend keeps its own
  write semantics.
- Resuming: ``--resume`` with no checkpoint named takes ``last_checkpoint``, or the
  newest complete checkpoint of the work dir (:func:`~mmgcu.checkpoint.files.resume_target`).
- Loading: a damaged file is named before torch reads it; mmengine's own checkpoint
  globals are allowed for that load only (:mod:`mmgcu.checkpoint.plain`).
"""

from typing import Callable, Optional, Tuple

from ..errors import GCUError
from .files import load_problem, resume_target, save_atomically
from .plain import mmengine_checkpoint_globals


class GCUCheckpointIO:
    """Checkpoint files of one run (stateless: each call names its files)."""

    def save(self, write: Callable[[str], None], out_dir: str, filename: str) -> None:
        """Write ``out_dir/filename`` with ``write(name)`` (mmengine's save, given the name
        to write to): atomically on a local disk."""
        if "://" in str(out_dir):  # a remote backend: its own write semantics
            write(filename)
            return
        save_atomically(write, out_dir, filename)

    def resume_target(self, work_dir: str) -> Tuple[Optional[str], Optional[str]]:
        """The checkpoint ``--resume`` takes when none is named, and a note for the log."""
        return resume_target(work_dir)

    def check(self, filename: str, work_dir: str) -> None:
        """Raise :class:`GCUError` naming ``filename`` when it is damaged."""
        problem = load_problem(filename, work_dir)
        if problem:
            raise GCUError(problem)

    def loading(self, filename: str):
        """Context of loading ``filename`` with torch >= 2.6's weights-only check, which
        refuses the HistoryBuffer and numpy objects mmengine 0.10.7 checkpoints pickle:
        exactly those are allowed, for this load."""
        return mmengine_checkpoint_globals(filename)
