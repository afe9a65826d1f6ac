"""The rehearsal's report, typed: phases, the error and its fix, the per-card summary.

:class:`Report` is what :func:`mmgcu.rehearsal.run.run_rehearsal` returns; its
:meth:`~Report.to_dict` is what :func:`~mmgcu.rehearsal.rehearse` returns and
``rehearsal.json`` holds, and :func:`mmgcu.rehearsal.text.format_report` prints it. The
summary is built from what each rank wrote (:mod:`mmgcu.rehearsal.hook`, :func:`read_ranks`).
"""

import json
import os
import os.path as osp
import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

from . import graphs
from .hook import OUT_DIR
from .memory import MemoryFigure
from .phases import Phase, all_passed

GIB = 1 << 30


@dataclass
class Error:
    """What the rehearsal stopped on: the phase it belongs to (``'end'``: every phase
    passed and a job failed as it ended), the message, and the fix mmgcu knows."""

    phase: Optional[str]
    message: str
    fix: Optional[str] = None


@dataclass
class CardPeak:
    """One card's peak over both jobs, and whether it fits the card's memory."""

    rank: int
    card: Optional[int]
    peak_bytes: int
    fits: bool


@dataclass
class Reads:
    """Card reads by the host per iteration: the first, and the mean of those after it."""

    first: Optional[float] = None
    later: Optional[float] = None


@dataclass
class GraphPart:
    """A lazy card's graphs (:mod:`mmgcu.rehearsal.graphs`): training's and validation's
    figures, what mmgcu kept whole, the heads left as they are, what stalls the card."""

    train: Optional[dict] = None
    val: Optional[dict] = None
    changes: List[str] = field(default_factory=list)
    kept: List[str] = field(default_factory=list)
    stalls: List[dict] = field(default_factory=list)


@dataclass
class Summary:
    """What rank 0 (and each card's peak) says of the jobs: memory, card reads, graph runs
    and seconds per iteration, losses, validation metrics, SyncBN, AMP, mmcv ops."""

    cards: List[CardPeak]
    peak_bytes: int
    card_memory_bytes: int
    fits: bool = True
    host_reads_per_iter: Reads = field(default_factory=Reads)
    graph_runs_per_step: Optional[float] = None
    seconds_per_iter: Optional[float] = None
    losses: List[dict] = field(default_factory=list)
    resume_losses: List[dict] = field(default_factory=list)
    val: Optional[dict] = None
    graph: Optional[GraphPart] = None
    sync_bn: Optional[dict] = None
    amp: Optional[str] = None
    optim_wrapper: Optional[str] = None
    card_ops: List[dict] = field(default_factory=list)
    cpu_path_ops: List[dict] = field(default_factory=list)


@dataclass
class Report:
    """A rehearsal of ``config`` on ``cards`` simulated cards of ``hardware`` (``'T20'``;
    its torch_gcu generation ``api``), standing for a job of ``world`` cards.

    ``crop`` is the rehearsal's training crop and ``config_crop`` the config's; ``json`` the
    path of ``rehearsal.json``; ``logs`` the jobs' logs. ``seconds`` (per job) and, at
    real scale, ``memory`` (each card's figure, :mod:`mmgcu.rehearsal.memory`) are there
    once the jobs ran; ``finish`` where the host killed a rank (the command that finishes
    the proof on this host).
    """

    config: str
    hardware: str
    api: str
    cards: int
    world: int
    host_available: Optional[int]
    iters: int
    scale: str
    torch: str
    work_dir: str
    json: str
    logs: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    crop: List[int] = field(default_factory=lambda: [0, 0])
    config_crop: List[int] = field(default_factory=lambda: [0, 0])
    phases: List[Phase] = field(default_factory=list)
    error: Optional[Error] = None
    summary: Optional[Summary] = None
    passed: bool = False
    seconds: Optional[Dict[str, float]] = None
    memory: Optional[MemoryFigure] = None
    finish: Optional[str] = None

    def settle(self) -> None:
        """Decide :attr:`passed`: every phase passed (or was skipped), no error, and at
        real scale the per-card figure fits."""
        fits = self.memory.fits if self.memory is not None else True
        self.passed = all_passed(self.phases) and self.error is None and fits

    def to_dict(self) -> dict:
        """The report as plain values (``rehearsal.json``): keys without a value yet are
        left out (``seconds`` and ``memory`` before the jobs run, ``memory`` at the small
        scale, ``finish`` unless a rank was killed); no summary is ``{}``."""
        out = asdict(self)
        out["summary"] = out["summary"] or {}
        if self.seconds is None:
            del out["seconds"]
        if self.seconds is None or self.scale != "real":
            del out["memory"]
        if self.finish is None:
            del out["finish"]
        return out


def read_ranks(work_dir: str, stage: str) -> Dict[int, dict]:
    """What each rank wrote for ``stage`` ('train' or 'resume')."""
    folder = osp.join(work_dir, OUT_DIR)
    ranks = {}
    if not osp.isdir(folder):
        return ranks
    for name in os.listdir(folder):
        found = re.fullmatch(rf"rank(\d+)-{stage}\.json", name)
        if found:
            with open(osp.join(folder, name)) as f:
                ranks[int(found.group(1))] = json.load(f)
    return ranks


def _per_iter(key: str, entries: List[dict]) -> Optional[float]:
    return round(statistics.mean(e[key] for e in entries), 3) if entries else None


def _card_peaks(ranks: List[dict], resume: Dict[int, dict], card_memory: int) -> List[CardPeak]:
    out = []
    for r in ranks:
        peak = max(r.get("peak_bytes", 0), resume.get(r["rank"], {}).get("peak_bytes", 0))
        out.append(CardPeak(r["rank"], r.get("card"), peak, peak <= card_memory))
    return out


def _losses(rank: dict) -> List[dict]:
    return [dict(iter=i["iter"], **i.get("losses", {})) for i in rank.get("iterations", [])]


def _seconds_per_iter(iters: List[List[dict]]) -> Optional[float]:
    """The median seconds of the iterations after each rank's first (of the first where
    the job ran one)."""
    later = [i for its in iters for i in its[1:]]
    seconds = [i["seconds"] for i in (later or [i for its in iters for i in its[:1]])]
    return round(statistics.median(seconds), 3) if seconds else None


def _graph_part(first: dict, factor: float) -> Optional[GraphPart]:
    """Rank 0's graphs, None off a lazy card (no graph figures)."""
    val_phase = next((p for p in first.get("phases", ()) if p["name"] == "val"), None)
    train, val = graphs.train_figures(first.get("iterations", [])), graphs.val_figures(val_phase)
    if not (train or val):
        return None
    changes = first.get("graph_changes") or {}
    return GraphPart(
        train=train,
        val=val,
        changes=changes.get("changed", []),
        kept=changes.get("kept", []),
        stalls=graphs.stalls(train, val, factor),
    )


def summarise(
    train: Dict[int, dict],
    resume: Dict[int, dict],
    card_memory: int,
    factor: float = 1.0,
) -> Optional[Summary]:
    """The summary of what the ranks wrote in the train and resume jobs (``factor``: the
    rehearsal's crops over the config's); None where no rank wrote anything."""
    ranks = [train[r] for r in sorted(train)]
    if not ranks:
        return None
    first, iters = ranks[0], [r.get("iterations", []) for r in ranks]
    cards = _card_peaks(ranks, resume, card_memory)
    every = [i for its in iters for i in its]
    val_phase = next((p for p in first.get("phases", ()) if p["name"] == "val"), {})
    return Summary(
        cards=cards,
        peak_bytes=max((c.peak_bytes for c in cards), default=0),
        card_memory_bytes=card_memory,
        fits=all(c.fits for c in cards),
        host_reads_per_iter=Reads(
            first=_per_iter("host_reads", [its[0] for its in iters if its]),
            later=_per_iter("host_reads", [i for its in iters for i in its[1:]]),
        ),
        graph_runs_per_step=_per_iter("graph_runs", every) if first.get("lazy") else None,
        seconds_per_iter=_seconds_per_iter(iters),
        losses=_losses(first),
        resume_losses=_losses(resume.get(first["rank"], {})),
        val=val_phase.get("metrics"),
        graph=_graph_part(first, factor),
        sync_bn=first.get("sync_bn"),
        amp=first.get("amp"),
        optim_wrapper=first.get("optim_wrapper"),
        card_ops=first.get("card_ops", []),
        cpu_path_ops=[o for o in first.get("card_ops", []) if o.get("cpu")],
    )
