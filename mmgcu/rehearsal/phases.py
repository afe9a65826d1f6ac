"""The phases of a rehearsal, and which one a failure belongs to.

Each phase passes, fails, is skipped (validation, for a config without it) or is not run
after a failure. Its status comes from what the ranks wrote (:mod:`mmgcu.rehearsal.hook`);
where a job failed, its log says which phase the error belongs to (:func:`blame`).
"""

import os.path as osp
from dataclasses import dataclass
from typing import Dict, List, Optional

from .logs import in_wrap_model

PASSED, FAILED, SKIPPED, NOT_RUN = "passed", "failed", "skipped", "not run"


@dataclass
class Phase:
    """One phase of the rehearsal: its name, status, and what it checked (or None)."""

    name: str
    status: str
    detail: Optional[str] = None


def _done(rank: dict, phase: str) -> bool:
    return any(p["name"] == phase for p in rank.get("phases", ()))


def _on_own_cards(ranks: List[dict]) -> bool:
    """Whether rank ``i``'s parameters are on card ``i`` of the kind of card its runner's
    accelerator drives (the ``device_type`` its hook recorded; None off a GCU card)."""
    return all(
        r.get("device_type") is not None and r.get("param_devices") == [f"{r['device_type']}:{i}"]
        for i, r in enumerate(ranks)
    )


def _checks(train: List[dict], resume: List[dict], iters: int, checkpoint, has_val: bool):
    """``(phase, passed: True, False or None for skipped, detail)`` in the order a job runs
    them (the checkpoint of the last iteration is saved before its validation)."""
    devices = ", ".join(str(r.get("param_devices")) for r in train)
    return [
        ("build", all(_done(r, "build") for r in train), None),
        ("placement", _on_own_cards(train), f"parameters on {devices}"),
        ("wrap", all(r.get("wrapped") or len(train) == 1 for r in train), train[0].get("wrapper")),
        (
            "train",
            all(len(r.get("iterations", ())) == iters for r in train),
            f"{iters} iteration(s)",
        ),
        ("save", bool(checkpoint and osp.isfile(checkpoint)), checkpoint),
        ("val", any(_done(r, "val") for r in train) if has_val else None, None),
        (
            "resume",
            all(
                r.get("resumed_from") == iters and len(r.get("iterations", ())) == 1 for r in resume
            ),
            f"from iteration {iters}, one more",
        ),
    ]


def phases_of(
    train: Dict[int, dict],
    resume: Dict[int, dict],
    cards: int,
    iters: int,
    checkpoint: Optional[str],
    has_val: bool = True,
) -> List[Phase]:
    """Each phase from what the ``cards`` ranks wrote in the train and resume jobs, with the
    checkpoint the train job saved; a phase after the first failure is not run."""
    every = [train.get(r, {}) for r in range(cards)]
    later = [resume.get(r, {}) for r in range(cards)]
    out, failed = [], False
    for name, ok, detail in _checks(every, later, iters, checkpoint, has_val):
        if failed:
            out.append(Phase(name, NOT_RUN))
            continue
        status = SKIPPED if ok is None else PASSED if ok else FAILED
        out.append(Phase(name, status, detail))
        failed = ok is False
    return out


def failed_to_start() -> List[Phase]:
    """The phases of a rehearsal whose config no job can run: the build failed."""
    return [Phase("build", FAILED)]


def first_failed(phases: List[Phase]) -> Optional[Phase]:
    return next((p for p in phases if p.status == FAILED), None)


def all_passed(phases: List[Phase]) -> bool:
    """Whether there are phases and each passed or was skipped."""
    return bool(phases) and all(p.status in (PASSED, SKIPPED) for p in phases)


def _named(phases: List[Phase], name: str) -> Phase:
    return next(p for p in phases if p.name == name)


def failing_job(phases: List[Phase], jobs: int) -> int:
    """The index of the job whose log says why the rehearsal failed, of the ``jobs`` that
    ran: the train job's for a phase it runs, else the last one's."""
    failed = first_failed(phases)
    return jobs - 1 if failed is None or failed.name == "resume" else 0


def blame(phases: List[Phase], log: str) -> Optional[Phase]:
    """The phase a failure belongs to, given the log of the job that failed; None where
    every phase passed (the job failed as it ended).

    A rank that left no record failed before the build ended, unless its log shows the
    runner's ``wrap_model``: then the model was built and putting it on its card or
    wrapping it failed, so the build passed and the placement failed (the phases change
    to say so).
    """
    failed = first_failed(phases)
    if failed is not None and failed.name == "build" and in_wrap_model(log):
        failed.status = PASSED
        failed = _named(phases, "placement")
        failed.status = FAILED
    return failed
