"""The report as the lines ``mmgcu rehearse`` prints: the run, each phase, the error and
its fix, each card's peak, the card's reads and graphs, SyncBN, AMP, mmcv ops, seconds,
losses, then the verdict."""

from typing import List, Optional

from ..launch.cards import GENERATION_NAMES
from . import host
from .memory import format_lines as memory_lines
from .report import GIB, GraphPart, Report, Summary


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _num(value) -> str:
    return "-" if value is None else f"{value:.5f}"


def _head(report: Report) -> List[str]:
    """The run: config, cards, torch_gcu and torch, iterations, scale and crops; the notes."""
    measured = f"; one card measured for a job of {report.world}" if report.memory else ""
    return [
        f"mmgcu rehearse {report.config}: {report.cards} simulated {report.hardware} card(s) "
        f"({GENERATION_NAMES[report.api]}, torch {report.torch}), {report.iters} "
        f"iteration(s), scale {report.scale} (crop {report.crop[0]}x{report.crop[1]} for "
        f"the config's {report.config_crop[0]}x{report.config_crop[1]}){measured}"
    ] + [f"  note: {n}" for n in report.notes]


def _phase_lines(report: Report) -> List[str]:
    out = []
    for p in report.phases:
        detail = f" ({p.detail})" if p.detail else ""
        out.append(f"  {p.name:<10} {p.status}{detail}")
    error = report.error
    if error is not None:
        out.append(f"  error ({error.phase}): {error.message}")
        if error.fix and not host.host_killed(report):  # the verdict says what to do
            out.append(f"  fix: {error.fix}")
    return out


def _card_lines(report: Report, s: Summary) -> List[str]:
    """Each card's peak against its memory, and at real scale each card's figure."""
    # at small crops the peak is the small job's: it says nothing of the real crop
    small = report.scale == "small" and report.crop != report.config_crop
    out = []
    for c in s.cards if s.peak_bytes else ():
        verdict = "fits" if c.fits else "DOES NOT FIT"
        verdict += " (at the small crop; --scale real for the config's)" if small else ""
        if report.memory:  # one rank of many: the figure per card is below
            verdict = "measured (each card of the job: below)"
        out.append(
            f"  card {c.card} (rank {c.rank}): peak {_gib(c.peak_bytes)} of "
            f"{_gib(s.card_memory_bytes)}: {verdict}"
        )
    return out + memory_lines(report.memory)


def _read_lines(s: Summary) -> List[str]:
    reads = s.host_reads_per_iter
    if reads.first is None:
        return []
    after = f", {reads.later} after" if reads.later is not None else ""
    out = [
        f"  card reads per iteration: {reads.first} in the first{after} (a log line every "
        "iteration: 1 is one read per log line)"
    ]
    if (reads.later or 0) > 1:
        out.append(
            "  note: more than one card read per log line: each read waits for the card "
            "(on torch_gcu 1.x it runs the pending lazy graph); the model's code reads "
            "card values every iteration"
        )
    return out


def _train_graph_lines(train: dict) -> List[str]:
    later = (
        f", {train['runs_later']} after warm-up"
        if train["runs_later"] is not None
        else " (warm-up only: --iters 3 or more shows a step after it)"
    )
    compiles = f"{train['compiles_warm_up']} in the first {min(train['steps'], 2)} step(s)"
    if train["compiles_later"] is not None:
        compiles += f", {train['compiles_later']} in {train['steps_later']} after"
    out = [
        f"  graph runs per step: {train['runs_first']} in the first{later}",
        f"  graphs compiled in training: {compiles}",
    ]
    for cut in train["cuts"]:
        out.append(
            f"  extra graph run: {cut['per_step']} a step, {cut['what']} ({cut['cause']}) at "
            f"{cut['caller']}"
        )
    return out


def _graph_lines(graph: Optional[GraphPart]) -> List[str]:
    """The lazy card's graphs, as the report prints them."""
    if graph is None:
        return []
    out = _train_graph_lines(graph.train) if graph.train else []
    val = graph.val
    if val:
        out.append(
            f"  validation: {val['compiles']} graph(s) compiled for {val['images']} image(s) of "
            f"{val['input_shapes']} input shape(s); {val['runs_per_image']} graph run(s) per image"
        )
    out += [f"  kept whole by mmgcu: {change}" for change in graph.changes]
    out += [f"  not changed: {h}'s own loss code (its acc_seg cuts the graph)" for h in graph.kept]
    for stall in graph.stalls:
        out.append(f"  STALLS THE CARD: {stall['what']}: {stall['cost']}")
        out.append(f"  fix: {stall['fix']}")
    return out


def _model_lines(s: Summary) -> List[str]:
    """SyncBN, AMP and the optimizer wrapper; mmcv ops and their paths; seconds; losses;
    validation metrics."""
    sync = s.sync_bn or {}
    out = [
        f"  SyncBN: {sync.get('layers', 0)} layer(s) {sync.get('classes', {})}, group "
        f"{', '.join(sync.get('groups', [])) or '-'}; AMP: {s.amp or 'off'} "
        f"({s.optim_wrapper})"
    ]
    out += [f"  mmcv op {op['op']} x{op['count']}: {op['path']}" for op in s.card_ops]
    cpu = [f"{o['op']} x{o['count']}" for o in s.cpu_path_ops]
    out.append(f"  ops on a CPU path (a host round trip per call): {', '.join(cpu) or 'none'}")
    if s.seconds_per_iter is not None:
        out.append(f"  seconds per iteration (simulated, this host): {s.seconds_per_iter}")
    out += [f"  iter {e['iter']}: loss {_num(e.get('loss'))}" for e in s.losses]
    out += [f"  iter {e['iter']} (resumed): loss {_num(e.get('loss'))}" for e in s.resume_losses]
    if s.val:
        out.append(f"  val: {s.val}")
    return out


def _summary_lines(report: Report) -> List[str]:
    s = report.summary
    if s is None or not s.cards:
        return []
    return _card_lines(report, s) + _read_lines(s) + _graph_lines(s.graph) + _model_lines(s)


def _verdict(report: Report) -> List[str]:
    """The last line(s): a rank the host killed, a card too small, failed, passed but
    stalling the card, or passed."""
    special = host.verdict_lines(report)
    if special:
        return special
    graph = report.summary.graph if report.summary is not None else None
    stalling = graph.stalls if graph is not None else []
    if not report.passed:
        verdict = f"FAILED: fix the error above before the {report.hardware} sees this config"
    elif stalling:
        verdict = (
            f"PASSED, BUT IT STALLS THE CARD ({len(stalling)} cause(s) above): it runs on the "
            f"{report.hardware} (mmgcu train CONFIG), at a fraction of the card's pace until "
            "the fixes above are made"
        )
    else:
        verdict = f"PASSED: launch it on the {report.hardware} with mmgcu train CONFIG"
    return [f"  verdict: {verdict}"]


def format_report(report: Report) -> str:
    """The report as the lines ``mmgcu rehearse`` prints."""
    out = _head(report) + _phase_lines(report) + _summary_lines(report)
    out.append(f"  report: {report.json}  log: {', '.join(report.logs)}")
    return "\n".join(out + _verdict(report))
