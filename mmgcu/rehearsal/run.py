"""``rehearse()``: a config on simulated cards, as a real job runs it, then the report.

The parts, each with one job: :mod:`.plan` derives the rehearsal's config, :mod:`.data`
writes its synthetic data, :mod:`.jobs` runs stock ``tools/train.py`` under torchrun twice
(train, validate and save; resume), and :mod:`.report` reads what the ranks wrote into a
:class:`~.report.Report` (:mod:`.phases`: each phase, and which one a failure belongs to;
:mod:`.logs`: a failed job's first error and its fix).

At real scale both jobs run one rank, whose card stands for each card of the job
(:mod:`.memory`), with the host heap setting of :func:`.host.heap_env`; the resume trains
its iteration at the small scale's crop (:func:`.plan.resume_derive`).
"""

import json
import os
import os.path as osp
from typing import Callable, Dict, List, Optional, Tuple

from ..launch import LaunchError, preflight, torchrun
from ..launch.cards import HARDWARE
from ..runtime.files import write_text_atomically
from . import data, host, memory, plan
from .errors import RehearsalError
from .hook import OUT_DIR, SEED_EACH_STEP_ENV
from .jobs import MARK, Jobs, job_env, prepare_work_dir
from .logs import first_error, fix_for
from .phases import blame, failed_to_start, failing_job, first_failed, phases_of
from .report import GIB, Error, Report, read_ranks, summarise

SCALES = ("small", "real")


def _options(cfg_options: Optional[Dict[str, object]]) -> List[str]:
    if not cfg_options:
        return []
    return ["--cfg-options"] + [f"{k}={v}" for k, v in cfg_options.items()]


def _checked(hardware: str, scale: str, iters: Optional[int], cards: int) -> int:
    """The iterations to train (``iters``, else the scale's default), once the arguments
    are known to make a rehearsal."""
    if hardware not in HARDWARE:
        raise RehearsalError(f"hardware {hardware!r}: one of {', '.join(HARDWARE)}")
    if scale not in SCALES:
        raise RehearsalError(f"scale {scale!r}: 'small' or 'real'")
    iters = plan.DEFAULT_ITERS[scale] if iters is None else iters
    if iters < 1 or cards < 1:
        raise RehearsalError("iters and cards must be at least 1")
    return iters


def _launchable(find: Callable, what):
    """``find(what)``: the config's file (a path, or a shipped config's name), or the
    training script of a job's environment; a RehearsalError where there is none."""
    try:
        return find(what)
    except LaunchError as e:
        raise RehearsalError(str(e)) from None


def _finish(report: Report, phase: Optional[str] = None, message: Optional[str] = None):
    """The report with the error it stopped on (if any) and its verdict, written as
    ``rehearsal.json``; where the host killed a rank, the command that finishes the proof
    on this host."""
    if message:
        ops = report.summary.card_ops if report.summary is not None else []
        report.error = Error(phase, message, fix_for(message, ops, report.torch))
        if host.host_killed(report):
            facts = memory.read(report.work_dir, 0, "train")
            report.finish = host.finish_command(report, facts)
    report.settle()
    write_text_atomically(report.json, json.dumps(report.to_dict(), indent=1))
    return report


def _config(report: Report, cfg_options: Optional[Dict[str, object]]):
    """The user's config with ``cfg_options`` merged as train.py merges them (so a
    ``custom_imports`` among them is not imported, as in a real job); None, the report
    failed in the build, where no job could run it."""
    from mmengine.config import Config

    problem = preflight.config_problem(report.config, _options(cfg_options))
    if problem is None:
        try:
            cfg = Config.fromfile(report.config)
        except Exception as e:  # every rank would fail on it the same way
            problem = f"{type(e).__name__}: {e}"
    if problem is not None:
        report.phases = failed_to_start()
        _finish(report, "build", problem)
        return None
    imports = cfg.get("custom_imports")
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
        cfg.custom_imports = imports  # train.py imports only the file's
    return cfg


def _resume_config(cfg, data_root: str, iters: int, scale: str, config: str):
    """The config the resume job runs, and a note: the train job's, or at real scale the
    small crops' (:func:`~.plan.resume_derive`), written beside it."""
    from mmengine.config import Config

    if scale != "real":
        return config, None
    derived, note = plan.resume_derive(cfg, data_root, iters)
    if derived is None:
        return config, note
    path = config[: -len("_rehearsal.py")] + "_resume.py"
    Config(derived).dump(path)
    return path, note


def rehearsal_config(work_dir: str, config: str) -> str:
    """The config a rehearsal of ``config`` in ``work_dir`` trains with (its synthetic data
    beside it): under rehearsal/, as the runner dumps the config it ran into the work dir by
    its name."""
    stem = osp.splitext(osp.basename(config))[0]
    return osp.join(work_dir, OUT_DIR, f"{stem}_rehearsal.py")


def _prepare(report: Report, cfg, echo: Callable[[str], None]) -> Tuple[str, str, dict]:
    """The rehearsal's config and the resume job's, written under the work dir with the
    synthetic data they read, and what the rehearsal changed (:func:`~.plan.derive`)."""
    from mmengine.config import Config

    data_root = osp.join(report.work_dir, "data")
    derived, changes = plan.derive(cfg, data_root, report.iters, report.scale)
    report.crop, report.config_crop = list(changes["crop"]), list(changes["config_crop"])
    report.notes = changes["notes"]
    report.notes.append(
        data.write_rehearsal_data(cfg, derived, changes, data_root, report.cards, report.scale)
    )
    for note in report.notes:
        echo(f"note: {note}")
    config = rehearsal_config(report.work_dir, report.config)
    os.makedirs(osp.dirname(config), exist_ok=True)
    Config(derived).dump(config)
    resume, note = _resume_config(cfg, data_root, report.iters, report.scale, config)
    if note:
        report.notes.append(note)
        echo(f"note: {note}")
    return config, resume, changes


def _conclude(report: Report, jobs: Jobs, checkpoint, changes: dict, card_memory: int):
    """The report of the jobs that ran: phases, summary, at real scale each card's figure,
    and the error a failed job's log names."""
    trained = read_ranks(report.work_dir, "train")
    resumed = read_ranks(report.work_dir, "resume")
    report.phases = phases_of(
        trained, resumed, report.cards, report.iters, checkpoint, changes["has_val"]
    )
    report.summary = summarise(trained, resumed, card_memory, changes["factor"])
    if report.scale == "real":
        facts = memory.read(report.work_dir, 0, "train")
        peak = report.summary.peak_bytes if report.summary is not None else 0
        report.memory = memory.per_card(facts, peak, report.world, card_memory) if facts else None
    if first_failed(report.phases) is None and not jobs.failed():
        return _finish(report)
    log = jobs.log(failing_job(report.phases, len(jobs.codes)))
    failed = blame(report.phases, log)
    message = first_error(log) or (failed.detail if failed is not None else None)
    phase = failed.name if failed is not None else "end"
    return _finish(report, phase, message or f"exit status {jobs.codes[-1]}")


def run_rehearsal(
    config: str,
    cards: int = 8,
    hardware: str = plan.DEFAULT_HARDWARE,
    iters: Optional[int] = None,
    scale: str = "small",
    card_memory_gib: float = plan.T20_MEMORY_GIB,
    cfg_options: Optional[Dict[str, object]] = None,
    work_dir: Optional[str] = None,
    echo: Callable[[str], None] = lambda line: None,
    seed_each_step: bool = False,
) -> Report:
    """Rehearse ``config`` on ``cards`` simulated cards of ``hardware`` ('t20': torch_gcu
    1.x; 's60': 2.x) and return the report (also written as ``rehearsal.json`` in the work
    dir, by default ``work_dirs/<config>_rehearsal``). At ``scale='real'`` one rank
    measures a card for a job of ``cards`` (:mod:`mmgcu.rehearsal.memory`). ``iters``
    defaults to :data:`~.plan.DEFAULT_ITERS` of the scale. ``cfg_options`` are merged as
    train.py's ``--cfg-options`` are. ``echo`` receives one line per step as it happens.
    ``seed_each_step`` seeds eager cards (S60) anew after each step as a T20's are, for a
    step-by-step comparison of the two generations (:data:`~.hook.SEED_EACH_STEP_ENV`).
    Raises :class:`~.errors.RehearsalError` for what it refuses before any job starts."""
    import torch

    iters = _checked(hardware, scale, iters, cards)
    ranks = plan.ranks(scale, cards)
    config = _launchable(torchrun.resolve_config, config)
    stem = osp.splitext(osp.basename(config))[0]
    work_dir = osp.abspath(work_dir or osp.join("work_dirs", f"{stem}_rehearsal"))
    env = job_env(os.environ, hardware, ranks, work_dir, host.heap_env(scale))
    if seed_each_step:
        env[SEED_EACH_STEP_ENV] = "1"
    script = _launchable(torchrun.train_script, env)
    prepare_work_dir(work_dir, config)
    report = Report(
        config=config,
        hardware=hardware.upper(),
        api=HARDWARE[hardware][0],
        cards=ranks,
        world=cards,
        host_available=host.available_bytes(),
        iters=iters,
        scale=scale,
        torch=torch.__version__.split("+")[0],
        work_dir=work_dir,
        json=osp.join(work_dir, MARK),
    )
    _finish(report)  # the mark of a rehearsal's work dir, from the start
    cfg = _config(report, cfg_options)
    if cfg is None:
        return report
    rehearsal_config, resume_config, changes = _prepare(report, cfg, echo)
    jobs = Jobs(work_dir, ranks, env, script)
    report.logs = jobs.logs
    checkpoint = jobs.train_then_resume(rehearsal_config, resume_config, iters, echo)
    report.seconds = jobs.seconds
    return _conclude(report, jobs, checkpoint, changes, int(card_memory_gib * GIB))


def rehearse(
    config: str,
    cards: int = 8,
    hardware: str = plan.DEFAULT_HARDWARE,
    iters: Optional[int] = None,
    scale: str = "small",
    card_memory_gib: float = plan.T20_MEMORY_GIB,
    cfg_options: Optional[Dict[str, object]] = None,
    work_dir: Optional[str] = None,
    echo: Callable[[str], None] = lambda line: None,
    seed_each_step: bool = False,
) -> dict:
    """:func:`run_rehearsal`'s report (same arguments) as plain values, what
    ``rehearsal.json`` holds."""
    report = run_rehearsal(
        config,
        cards,
        hardware,
        iters,
        scale,
        card_memory_gib,
        cfg_options,
        work_dir,
        echo,
        seed_each_step,
    )
    return report.to_dict()
