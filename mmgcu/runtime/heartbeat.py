"""Heartbeats: what each rank is doing, in a small file every rank of the job can read.

Each rank's watchdog thread (:mod:`mmgcu.engine.hooks.watchdog`) replaces
``WORK_DIR/.mmgcu/heartbeat/RUN/rankR.json`` every few seconds with its host, pid, card,
phase and iteration, numbers the runner already holds on the host. The files live in the
work dir, not in the launcher's store: they need no private torch API, an operator can
read them (``cat work_dirs/x/.mmgcu/heartbeat/*/rank*.json``), and they stay readable
whichever rank is stopped (under slurm and mpi the store is served by rank 0's process).
The work dir must be shared between nodes anyway, for ``--resume``.

A beat's age is measured on the reader's clock (when the reader saw it change), so the
hosts' clocks need not agree. :func:`diagnose` names the rank a stalled job waits for.
"""

import os
import os.path as osp
import shutil
from typing import Dict, List, NamedTuple, Optional

from .files import rank_file, read_rank_files, write_json_atomically

#: Phases, in the order they follow each other for one value of ``runner.iter``: the
#: validation after iteration N runs with iter N, then train step N+1, then its save.
ORDER = {"start": 0, "val": 1, "evaluate": 2, "train": 3, "save": 4, "wait": 4, "done": 5}
#: Phases whose silences are long by nature: compiling the first step's graph, rank 0
#: computing metrics while the others wait, rank 0 writing a checkpoint.
SLOW = {"start", "evaluate", "save"}
#: Phases of a rank that waits on purpose (for rank 0's save), or has finished.
IDLE = {"wait", "done"}
#: What a rank's main thread shows while it waits in a collective.
_COLLECTIVE = ("torch/distributed/", "torch/nn/parallel/", "torch/autograd/", "distributed")
_WORDS = {
    "start": "its first iteration",
    "train": "a train step",
    "val": "validation",
    "evaluate": "the validation metrics",
    "save": "a checkpoint save",
    "wait": "a wait for rank 0's checkpoint save",
    "done": "finished",
}


def beat_dir(work_dir: str, run: str) -> str:
    return osp.join(work_dir, ".mmgcu", "heartbeat", run)


def remove_other_runs(folder: str) -> None:
    """Remove the heartbeats of earlier runs beside this run's ``folder``."""
    parent, mine = osp.split(folder)
    for name in os.listdir(parent):
        if name != mine:
            shutil.rmtree(osp.join(parent, name), ignore_errors=True)


def write_beat(folder: str, beat: dict) -> None:
    """Replace this rank's beat file (readers see the old or the new one, never half)."""
    write_json_atomically(rank_file(folder, beat["rank"]), beat, durable=False)


def read_beats(folder: str) -> Dict[int, dict]:
    """Every rank's last beat in ``folder`` (ranks whose file is unreadable are left out)."""
    return read_rank_files(folder)


def progress(beat: dict) -> tuple:
    """Where a rank is in the run, comparable between ranks."""
    return beat["iter"], ORDER.get(beat["phase"], 0), beat.get("step", 0)


def describe(beat: dict) -> str:
    """``'a train step (iteration 7)'``, in the words of the messages."""
    words = _WORDS.get(beat["phase"], beat["phase"])
    if beat["phase"] in ("val", "evaluate"):
        return f"{words} (after iteration {beat['iter']}, batch {beat.get('step', 0) + 1})"
    return f"{words} (iteration {beat['iter'] + 1})"


def in_collective(where: str) -> bool:
    """Whether a main thread's innermost frames (``where``) wait in a collective."""
    return any(part in where for part in _COLLECTIVE)


class Observer:
    """When this rank last saw each rank's beat and progress change (on its own clock)."""

    def __init__(self):
        self.seen: Dict[int, dict] = {}

    def update(self, beats: Dict[int, dict], now: float) -> None:
        for rank, beat in beats.items():
            old = self.seen.get(rank)
            if old is None:
                self.seen[rank] = dict(seq=beat["seq"], key=progress(beat), beat=now, moved=now)
                continue
            if beat["seq"] != old["seq"]:
                old.update(seq=beat["seq"], beat=now)
            if progress(beat) != old["key"]:
                old.update(key=progress(beat), moved=now)

    def silence(self, rank: int, now: float) -> float:
        """Seconds since ``rank``'s beat last changed."""
        return now - self.seen[rank]["beat"]

    def stall(self, now: float) -> float:
        """Seconds since any rank's progress last changed."""
        return now - max(s["moved"] for s in self.seen.values()) if self.seen else 0.0


class Verdict(NamedTuple):
    """Which ranks a stalled job waits for, and how that was seen."""

    culprits: List[int]
    how: str  # 'silent', 'behind', 'elsewhere' or 'unknown'
    slow: bool  # whether a slow phase explains the silence (the longer bound applies)


def diagnose(beats: Dict[int, dict], silent: List[int]) -> Verdict:
    """The ranks a stalled job waits for.

    ``silent``: ranks whose beat stopped (a stopped or frozen process). Otherwise the
    ranks behind the others; otherwise, when all are level, those whose main thread is not
    waiting in a collective. A rank still in its first iteration may be compiling its
    graph, and the slow bound applies to it, as to the phases in :data:`SLOW`.
    """
    active = {r: b for r, b in beats.items() if b["phase"] not in IDLE}
    if silent:
        return _verdict(silent, "silent", beats)
    if not active:
        return Verdict([], "unknown", True)
    lowest = min(progress(b) for b in active.values())
    behind = sorted(r for r, b in active.items() if progress(b) == lowest)
    if any(progress(b) > lowest for b in beats.values()):
        return _verdict(behind, "behind", beats)
    elsewhere = sorted(r for r, b in active.items() if not in_collective(b.get("where", "")))
    if elsewhere and len(elsewhere) < len(beats):
        return _verdict(elsewhere, "elsewhere", beats)
    slow = any(_slow(b) for b in beats.values())
    return Verdict([], "unknown", slow)


def _slow(beat: dict) -> bool:
    return beat["phase"] in SLOW or beat["iter"] <= beat.get("start", -1)


def _verdict(ranks, how: str, beats) -> Verdict:
    slow = any(_slow(beats[r]) for r in ranks if r in beats)
    return Verdict(sorted(ranks), how, slow)


def process_state(pid: int) -> Optional[tuple]:
    """``(state letter, CPU ticks)`` of a process on this host, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return fields[0], int(fields[11]) + int(fields[12])  # utime + stime
