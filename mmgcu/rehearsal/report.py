"""The rehearsal's report: phases, the first error and its fix, cards, reads, losses.

Built from what each rank wrote (:mod:`mmgcu.rehearsal.hook`) and from the job's log: a
rank that fails before its hooks run (a config or registry error, a model that cannot be
built) leaves only the log, whose first exception is the one reported.
"""

import json
import os
import os.path as osp
import re
import statistics
from typing import Dict, List, Optional, Tuple

from . import graphs, host
from .hook import OUT_DIR
from .memory import format_lines as memory_lines

GIB = 1 << 30
#: The phases of a rehearsal, in order.
PHASES = ("build", "placement", "wrap", "train", "val", "save", "resume")

#: mmcv's dispatcher refusing a compiled op on a device it has no kernel for.
_NO_KERNEL = re.compile(
    r"(\w+?)(?:_forward|_backward)?_impl: implementation for device (\S+) not found"
)
#: Known failures and what fixes them: (pattern, fix; ``{0}``.. are the pattern's groups).
FIXES: Tuple[Tuple[re.Pattern, str], ...] = (
    (
        _NO_KERNEL,
        "mmcv's compiled op '{0}' has no kernel on a GCU card ({1}), and mmgcu has no "
        "counterpart for it (mmgcu runs PSAMask on the card). Build the model without the "
        "layer that calls it (for a DCN backbone: leave out its dcn dict), or give the op a "
        "card path and register it in mmgcu/model/mmcv_ops.py.",
    ),
    (
        re.compile(r"ProcessGroupGloo::(\w+): unsupported device type (xla)"),
        "the model gives a card tensor to torch.distributed's {0} on a gloo group, which "
        "carries CPU tensors only. On torch_gcu 1.x mmgcu's default group (gloo_eccl) sends "
        "card tensors to ECCL: leave env_cfg.dist_cfg.backend unset (or 'eccl') and make the "
        "model's groups without backend='gloo', or move that tensor to the CPU and back "
        "around the call.",
    ),
    (
        re.compile(r"No module named '(mmpretrain|mmdet|torchvision)"),
        "this environment lacks {0}: on the T20 stack tools/install_t20.sh installs "
        "mmpretrain 1.2.0, mmdet 3.3.0 and, when missing, torchvision 0.11.3 (docs/t20.md); "
        "on torch 2.13 no torchvision build exists here, so rehearse such models on the "
        "T20 stack.",
    ),
    (
        re.compile(r"'?(\S+?)'? is not in the (\S+) registry"),
        "'{0}' is not registered: add the module that defines it to custom_imports in the "
        "config (custom_imports given with --cfg-options is not imported).",
    ),
    (
        re.compile(r"killed by SIGKILL.*out-of-memory"),
        "the simulated cards of all ranks share this host's memory: rehearse on fewer "
        "--cards, or at --scale small, or on a host with more memory. The per-card peak of "
        "a run that fits says what each card needs.",
    ),
    (
        re.compile(r"(aten::batch_norm_stats|batch_norm_gather_stats|batch_norm_elemt)"),
        "torch's SyncBatchNorm has no GCU kernel ({0}); run with runner_type='GCURunner', "
        "which puts GCUSyncBatchNorm in place of SyncBN layers.",
    ),
)


def fix_for(message: str, card_ops: List[dict] = ()) -> Optional[str]:
    """The fix mmgcu knows for an error message, or None; ``card_ops`` (the model's mmcv
    layers, as the hook lists them) names the layers of an op with no card kernel."""
    for pattern, fix in FIXES:
        found = pattern.search(message)
        if found:
            text = fix.format(*found.groups())
            if pattern is _NO_KERNEL:
                layers = [f"{o['op']} x{o['count']}" for o in card_ops if "no card" in o["path"]]
                text += (
                    f" The model's layers with no card kernel: {', '.join(layers)}."
                    if layers
                    else ""
                )
            return text
    return None


#: torchrun's prefix on a worker's lines (torch 2's ``[rank1]: ``).
_RANK_PREFIX = re.compile(r"^\[(?:default)?(?:rank)?\d+\]:\s?")
# An exception's own line: its name alone, or with ': ' and the message. Not a name that
# another rank's unmarked output cut short (torch 1.10, unbuffered ranks writing the same
# log: "IndexError  File ...", then ": index 255 ..." on the next line).
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)(:\s|:$|$)")


def _by_rank(log: str) -> List[Tuple[str, str]]:
    """``(rank prefix or '', line)`` for each line of a job's log."""
    out = []
    for raw in log.splitlines():
        found = _RANK_PREFIX.match(raw)
        out.append((found.group(0).strip(), raw[found.end() :]) if found else ("", raw))
    return out


def first_error(log: str) -> Optional[str]:
    """The first exception in a job's log (the last line of its first traceback, read
    among the lines of the same rank where torchrun marks them), or the message mmgcu's
    excepthook printed in its place (``mmgcu: ...`` after a blank line, alone or under the
    exception's own line); None when the log has neither."""
    lines = _by_rank(log)
    for i, (who, line) in enumerate(lines):
        if line.startswith("mmgcu: ") and "stops: rank 0 says why" not in line:
            # a blank line carries no rank prefix: it belongs to any rank
            before = [t for r, t in lines[max(0, i - 2) : i] if r == who or not t.strip()]
            if before and not before[-1].strip():
                return line
            if len(before) == 2 and not before[0].strip() and _EXCEPTION.match(before[1]):
                return f"{before[1]}\n{line}"
        if line.startswith("Traceback (most recent call last)"):
            # the first exception line after it: torch 1.10's torchrun does not mark its
            # ranks' lines, so another rank's traceback or log may come in between
            found = next(
                (t for r, t in lines[i + 1 :] if r == who and _EXCEPTION.match(t)),
                "",
            )
            if found and "ChildFailedError" not in found:  # not torchrun's own summary
                return found.strip()
    for _, line in lines:  # no traceback: a rank killed (torchrun's summary says how)
        if re.search(r"exitcode\s*:\s*-9\b", line):
            return (
                "a rank was killed by SIGKILL with no traceback (exitcode -9): most likely "
                "the kernel's out-of-memory killer, since simulated cards are host memory"
            )
    for _, line in lines:
        if "ChildFailedError" in line or "exitcode" in line:
            return line.strip()
    return None


def in_wrap_model(log: str) -> bool:
    """Whether a rank that left no record failed in the runner's ``wrap_model`` (the model
    built, then put on its card and wrapped in DDP), rather than building the model."""
    return re.search(r", in wrap_model\b", log) is not None


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


def _done(rank: dict, phase: str) -> bool:
    return any(p["name"] == phase for p in rank.get("phases", ()))


def phases_of(
    train: Dict[int, dict],
    resume: Dict[int, dict],
    cards: int,
    iters: int,
    device: str,
    checkpoint: Optional[str],
    has_val: bool = True,
) -> List[dict]:
    """Each phase in the order a job runs them (the checkpoint of the last iteration is
    saved before its validation), passed, failed, skipped or not run after a failure."""
    every = [train.get(r, {}) for r in range(cards)]
    devices = [r.get("param_devices") for r in every]
    later = [resume.get(r, {}) for r in range(cards)]
    checks = [
        ("build", all(_done(r, "build") for r in every), None),
        (
            "placement",
            devices == [[f"{device}:{i}"] for i in range(cards)],
            "parameters on " + ", ".join(str(d) for d in devices),
        ),
        (
            "wrap",
            all(r.get("wrapped") or cards == 1 for r in every),
            every[0].get("wrapper"),
        ),
        (
            "train",
            all(len(r.get("iterations", ())) == iters for r in every),
            f"{iters} iteration(s)",
        ),
        ("save", bool(checkpoint and osp.isfile(checkpoint)), checkpoint),
        ("val", None if not has_val else any(_done(r, "val") for r in every), None),
        (
            "resume",
            all(
                r.get("resumed_from") == iters and len(r.get("iterations", ())) == 1 for r in later
            ),
            f"from iteration {iters}, one more",
        ),
    ]
    out, failed = [], False
    for name, ok, detail in checks:
        if failed:
            status = "not run"
        elif ok is None:
            status = "skipped"
        else:
            status = "passed" if ok else "failed"
        failed = failed or ok is False
        out.append(dict(name=name, status=status, detail=detail if status != "not run" else None))
    return out


def summarise(
    train: Dict[int, dict],
    resume: Dict[int, dict],
    cards: int,
    card_memory: int,
    factor: float = 1.0,
) -> dict:
    """Per-card peaks, reads and graph runs per iteration, seconds, losses, SyncBN, AMP, and
    on a lazy card its graphs (``factor``: the rehearsal's crops over the config's)."""
    ranks = [train[r] for r in sorted(train)]
    if not ranks:
        return {}
    first = ranks[0]
    card_rows = []
    for r in ranks:
        peak = max(r.get("peak_bytes", 0), resume.get(r["rank"], {}).get("peak_bytes", 0))
        card_rows.append(
            dict(rank=r["rank"], card=r.get("card"), peak_bytes=peak, fits=peak <= card_memory)
        )
    iters = [r.get("iterations", []) for r in ranks]
    later = [i for its in iters for i in its[1:]]

    def per_iter(key, entries):
        return round(statistics.mean(e[key] for e in entries), 3) if entries else None

    seconds = [i["seconds"] for i in (later or [i for its in iters for i in its[:1]])]
    val_phase = next((p for p in first.get("phases", ()) if p["name"] == "val"), None)
    train_graph = graphs.train_figures(first.get("iterations", []))
    val_graph = graphs.val_figures(val_phase)
    return dict(
        cards=card_rows,
        peak_bytes=max((c["peak_bytes"] for c in card_rows), default=0),
        card_memory_bytes=card_memory,
        fits=all(c["fits"] for c in card_rows),
        host_reads_per_iter=dict(
            first=per_iter("host_reads", [its[0] for its in iters if its]),
            later=per_iter("host_reads", later),
        ),
        graph_runs_per_step=per_iter("graph_runs", [i for its in iters for i in its])
        if first.get("api") == "gcu1"
        else None,
        seconds_per_iter=round(statistics.median(seconds), 3) if seconds else None,
        losses=[dict(iter=i["iter"], **i.get("losses", {})) for i in first.get("iterations", [])],
        resume_losses=[
            dict(iter=i["iter"], **i.get("losses", {}))
            for i in resume.get(first["rank"], {}).get("iterations", [])
        ],
        val=(val_phase or {}).get("metrics"),
        graph=dict(
            train=train_graph,
            val=val_graph,
            changes=(first.get("graph_changes") or {}).get("changed", []),
            kept=(first.get("graph_changes") or {}).get("kept", []),
            stalls=graphs.stalls(train_graph, val_graph, factor),
        )
        if train_graph or val_graph
        else None,
        sync_bn=first.get("sync_bn"),
        amp=first.get("amp"),
        optim_wrapper=first.get("optim_wrapper"),
        card_ops=first.get("card_ops", []),
        cpu_path_ops=[o for o in first.get("card_ops", []) if o.get("cpu")],
    )


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _num(value) -> str:
    return "-" if value is None else f"{value:.5f}"


def _graph_lines(graph: Optional[dict]) -> List[str]:
    """The lazy card's graphs, as the report prints them."""
    if not graph:
        return []
    out = []
    train, val = graph.get("train"), graph.get("val")
    if train:
        later = (
            f", {train['runs_later']} after warm-up"
            if train["runs_later"] is not None
            else " (warm-up only: --iters 3 or more shows a step after it)"
        )
        out.append(f"  graph runs per step: {train['runs_first']} in the first{later}")
        compiles = f"{train['compiles_warm_up']} in the first {min(train['steps'], 2)} step(s)"
        if train["compiles_later"] is not None:
            compiles += f", {train['compiles_later']} in {train['steps_later']} after"
        out.append(f"  graphs compiled in training: {compiles}")
        for cut in train["cuts"]:
            out.append(
                f"  extra graph run: {cut['per_step']} a step, {cut['what']} ({cut['cause']}) at "
                f"{cut['caller']}"
            )
    if val:
        out.append(
            f"  validation: {val['compiles']} graph(s) compiled for {val['images']} image(s) of "
            f"{val['input_shapes']} input shape(s); {val['runs_per_image']} graph run(s) per image"
        )
    for change in graph.get("changes", ()):
        out.append(f"  kept whole by mmgcu: {change}")
    for head in graph.get("kept", ()):
        out.append(f"  not changed: {head}'s own loss code (its acc_seg cuts the graph)")
    for stall in graph.get("stalls", ()):
        out.append(f"  STALLS THE CARD: {stall['what']}: {stall['cost']}")
        out.append(f"  fix: {stall['fix']}")
    return out


def format_report(report: dict) -> str:
    """The report as the lines ``mmgcu rehearse`` prints."""
    out = [
        f"mmgcu rehearse {report['config']}: {report['cards']} simulated {report['hardware']} "
        f"card(s) (torch_gcu {'1.x' if report['api'] == 'gcu1' else '2.x'}, torch "
        f"{report['torch']}), {report['iters']} iteration(s), scale {report['scale']} "
        f"(crop {report['crop'][0]}x{report['crop'][1]} for the config's "
        f"{report['config_crop'][0]}x{report['config_crop'][1]})"
        + (f"; one card measured for a job of {report['world']}" if report.get("memory") else ""),
    ]
    out += [f"  note: {n}" for n in report.get("notes", [])]
    for p in report["phases"]:
        detail = f" ({p['detail']})" if p.get("detail") else ""
        out.append(f"  {p['name']:<10} {p['status']}{detail}")
    error = report.get("error")
    if error:
        out.append(f"  error ({error['phase']}): {error['message']}")
        if error.get("fix") and not host.host_killed(report):  # the verdict says what to do
            out.append(f"  fix: {error['fix']}")
    s = report.get("summary") or {}
    if s.get("cards"):
        memory = s["card_memory_bytes"]
        # at small crops the peak is the small job's: it says nothing of the real crop
        small = report["scale"] == "small" and report["crop"] != report.get("config_crop")
        for c in s["cards"] if s["peak_bytes"] else ():
            verdict = "fits" if c["fits"] else "DOES NOT FIT"
            verdict += " (at the small crop; --scale real for the config's)" if small else ""
            if report.get("memory"):  # one rank of many: the figure per card is below
                verdict = "measured (each card of the job: below)"
            out.append(
                f"  card {c['card']} (rank {c['rank']}): peak {_gib(c['peak_bytes'])} of "
                f"{_gib(memory)}: {verdict}"
            )
        out += memory_lines(report.get("memory"))
        reads = s["host_reads_per_iter"]
        if reads["first"] is not None:
            after = f", {reads['later']} after" if reads["later"] is not None else ""
            out.append(
                f"  card reads per iteration: {reads['first']} in the first{after} (a log "
                "line every iteration: 1 is one read per log line)"
            )
        if (reads["later"] or 0) > 1:
            out.append(
                "  note: more than one card read per log line: each read waits for the card "
                "(on torch_gcu 1.x it runs the pending lazy graph); the model's code reads "
                "card values every iteration"
            )
        out += _graph_lines(s.get("graph"))
        sync = s.get("sync_bn") or {}
        out.append(
            f"  SyncBN: {sync.get('layers', 0)} layer(s) {sync.get('classes', {})}, group "
            f"{', '.join(sync.get('groups', [])) or '-'}; AMP: {s.get('amp') or 'off'} "
            f"({s.get('optim_wrapper')})"
        )
        for op in s.get("card_ops", []):
            out.append(f"  mmcv op {op['op']} x{op['count']}: {op['path']}")
        cpu = [f"{o['op']} x{o['count']}" for o in s.get("cpu_path_ops", [])]
        out.append(f"  ops on a CPU path (a host round trip per call): {', '.join(cpu) or 'none'}")
        if s["seconds_per_iter"] is not None:
            out.append(f"  seconds per iteration (simulated, this host): {s['seconds_per_iter']}")
        for entry in s.get("losses", []):
            out.append(f"  iter {entry['iter']}: loss {_num(entry.get('loss'))}")
        for entry in s.get("resume_losses", []):
            out.append(f"  iter {entry['iter']} (resumed): loss {_num(entry.get('loss'))}")
        if s.get("val"):
            out.append(f"  val: {s['val']}")
    out.append(f"  report: {report['json']}  log: {', '.join(report['logs'])}")
    stalling = ((s or {}).get("graph") or {}).get("stalls")
    special = host.verdict_lines(report)  # a rank the host killed; a card that is too small
    if special:
        return "\n".join(out + special)
    if not report["passed"]:
        verdict = f"FAILED: fix the error above before the {report['hardware']} sees this config"
    elif stalling:
        verdict = (
            f"PASSED, BUT IT STALLS THE CARD ({len(stalling)} cause(s) above): it runs on the "
            f"{report['hardware']} (mmgcu train CONFIG), at a fraction of the card's pace until "
            "the fixes above are made"
        )
    else:
        verdict = f"PASSED: launch it on the {report['hardware']} with mmgcu train CONFIG"
    out.append(f"  verdict: {verdict}")
    return "\n".join(out)
