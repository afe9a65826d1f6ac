"""``rehearse()``: a config on simulated cards, as a real job runs it, then the report.

Two jobs, each stock ``tools/train.py`` under torchrun with ``--launcher pytorch`` (what
``mmgcu train`` runs), with ``MMGCU_SIMULATE=<hardware>:<cards>``: the first builds, places,
wraps, trains ``iters`` iterations, validates and saves; the second resumes from that
checkpoint and trains one more iteration, without a save of its own (the first job's save
proved the path; a second would write every weight and optimizer state again, most of a
ViT's resume). Nothing in the runner knows it is a rehearsal.

At real scale both jobs run one rank, whose card stands for each card of the job
(:mod:`.memory`), with the host heap setting of :func:`.host.heap_env`; the resume trains
its iteration at the small scale's crop (:func:`.plan.resume_derive`).
"""

import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

from ..cli import launch, preflight
from ..device.cards import HARDWARE, SIMULATE_ENV
from ..runtime.files import write_text_atomically
from ..runtime.locks import LOCK_DIR_ENV
from . import data, host, memory, plan, report
from .hook import OUT_DIR

GIB = report.GIB
T20_MEMORY_GIB = plan.T20_MEMORY_GIB
MARK = "rehearsal.json"
#: Validation images per card: enough shapes to see what each new one costs a lazy card.
VAL_IMAGES_PER_CARD = 8


def _options(cfg_options: Optional[Dict[str, object]]) -> List[str]:
    if not cfg_options:
        return []
    return ["--cfg-options"] + [f"{k}={v}" for k, v in cfg_options.items()]


def prepare_work_dir(work_dir: str, config: str) -> None:
    """An empty work dir: an earlier rehearsal's is cleared, anything else is refused."""
    if osp.abspath(config).startswith(osp.join(osp.abspath(work_dir), "")):
        raise ValueError(
            f"the config {config} is inside the work dir {work_dir}, which the "
            "rehearsal clears: give --work-dir another folder"
        )
    if osp.isdir(work_dir) and os.listdir(work_dir):
        if not osp.isfile(osp.join(work_dir, MARK)):
            raise ValueError(
                f"{work_dir} is not empty and holds no earlier rehearsal: give "
                "--work-dir a new folder (the rehearsal replaces what it finds there)"
            )
        shutil.rmtree(work_dir)
    os.makedirs(work_dir, exist_ok=True)


#: What would make the rehearsal's torchrun join another job's rendezvous: it runs alone.
MULTI_NODE_VARS = ("NNODES", "NODE_RANK", "MASTER_ADDR", "PORT")


def _launch(
    config: str,
    work_dir: str,
    cards: int,
    hardware: str,
    extra: List[str],
    log: str,
    heap: Optional[Dict[str, str]] = None,
) -> int:
    """One torchrun job of stock train.py on simulated cards; its output goes to ``log``;
    ``heap``: the ranks' glibc heap setting (:func:`mmgcu.rehearsal.host.heap_env`)."""
    env = {k: v for k, v in os.environ.items() if k not in MULTI_NODE_VARS}
    env.update(heap or {})
    env[SIMULATE_ENV] = f"{hardware}:{cards}"
    # Simulated cards are this rehearsal's own: their locks too (a real job's card locks,
    # or another rehearsal's, are no business of theirs).
    env[LOCK_DIR_ENV] = osp.join(work_dir, "card-locks")
    env.pop("MMGCU_SIMULATE_API", None)
    env.pop("MMGCU_SIMULATE_NOTICE", None)  # each job's log says it is simulated
    command = [sys.executable, "-m", "torch.distributed.run"]
    command += launch.torchrun_flags(env, launch.torch_version())
    command += [f"--nproc_per_node={cards}", *launch.train_script(env), config]
    command += ["--work-dir", work_dir, "--launcher", "pytorch", *extra]
    with open(log, "w") as f:
        return subprocess.call(
            command, env=launch.worker_env(env), stdout=f, stderr=subprocess.STDOUT
        )


def last_checkpoint(work_dir: str) -> Optional[str]:
    """The checkpoint the job saved last (mmengine's ``last_checkpoint`` file names it)."""
    try:
        with open(osp.join(work_dir, "last_checkpoint")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def rehearse(
    config: str,
    cards: int = 8,
    hardware: str = "t20",
    iters: Optional[int] = None,
    scale: str = "small",
    card_memory_gib: float = T20_MEMORY_GIB,
    cfg_options: Optional[Dict[str, object]] = None,
    work_dir: Optional[str] = None,
    echo: Callable[[str], None] = lambda line: None,
) -> dict:
    """Rehearse ``config`` on ``cards`` simulated cards of ``hardware`` ('t20': torch_gcu
    1.x; 's60': 2.x) and return the report (also written as ``rehearsal.json`` in the work
    dir). At ``scale='real'`` one rank measures a card for a job of ``cards``
    (:mod:`mmgcu.rehearsal.memory`). ``iters`` defaults to :data:`~.plan.DEFAULT_ITERS` of
    the scale. ``cfg_options`` are merged as train.py's ``--cfg-options`` are (so a
    ``custom_imports`` among them is not imported, as in a real job). ``echo`` receives one
    line per step as it happens."""
    import torch
    from mmengine.config import Config

    if hardware not in HARDWARE:
        raise ValueError(f"hardware {hardware!r}: one of {', '.join(HARDWARE)}")
    if scale not in ("small", "real"):
        raise ValueError(f"scale {scale!r}: 'small' or 'real'")
    iters = plan.DEFAULT_ITERS[scale] if iters is None else iters
    if iters < 1 or cards < 1:
        raise ValueError("iters and cards must be at least 1")
    config = launch.resolve_config(config)
    stem = osp.splitext(osp.basename(config))[0]
    work_dir = osp.abspath(work_dir or osp.join("work_dirs", f"{stem}_rehearsal"))
    prepare_work_dir(work_dir, config)
    api = HARDWARE[hardware][0]
    ranks = plan.ranks(scale, cards)
    result = dict(
        config=config,
        hardware=hardware.upper(),
        api=api,
        cards=ranks,
        world=cards,
        host_available=host.available_bytes(),
        iters=iters,
        scale=scale,
        torch=torch.__version__.split("+")[0],
        work_dir=work_dir,
        json=osp.join(work_dir, MARK),
        logs=[],
        notes=[],
        crop=[0, 0],
        config_crop=[0, 0],
        phases=[],
        error=None,
        summary={},
        passed=False,
    )

    def finish(phase: Optional[str] = None, message: Optional[str] = None) -> dict:
        if message:
            ops = (result["summary"] or {}).get("card_ops", [])
            fix = report.fix_for(message, ops)
            result["error"] = dict(phase=phase, message=message, fix=fix)
            if host.host_killed(result):  # what this host can still prove, and how
                facts = memory.read(work_dir, 0, "train")
                result["finish"] = host.finish_command(result, facts)
        result["passed"] = (
            bool(result["phases"])
            and not result["error"]
            and all(p["status"] in ("passed", "skipped") for p in result["phases"])
            and (result.get("memory") or {}).get("fits", True)
        )
        write_text_atomically(result["json"], json.dumps(result, indent=1))
        return result

    def fail_early(message: str) -> dict:
        result["phases"] = [dict(name="build", status="failed", detail=None)]
        return finish("build", message)

    finish()  # the mark of a rehearsal's work dir, from the start
    problem = preflight.config_problem(config, _options(cfg_options))
    if problem:
        return fail_early(problem)
    try:
        cfg = Config.fromfile(config)
    except Exception as e:  # every rank would fail on it the same way
        return fail_early(f"{type(e).__name__}: {e}")
    imports = cfg.get("custom_imports")
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
        cfg.custom_imports = imports  # train.py imports only the file's
    data_root = osp.join(work_dir, "data")
    derived, changes = plan.derive(cfg, data_root, iters, scale)
    result["crop"] = list(changes["crop"])
    result["config_crop"] = list(changes["config_crop"])
    result["notes"] = changes["notes"]
    batch = int(derived["train_dataloader"].get("batch_size", 1))
    side = changes["image_side"]
    written = data.write_dataset(
        data_root,
        derived["train_dataloader"]["dataset"],
        "train",
        [(side, side)] * (ranks * batch),
        derived["model"],
    )
    val = "no val"
    if changes["has_val"]:
        per_rank = VAL_IMAGES_PER_CARD if scale == "small" else plan.REAL_VAL_IMAGES
        sizes, where = data.val_sizes(
            cfg.val_dataloader.dataset, ranks * per_rank, side, changes["factor"]
        )
        data.write_dataset(
            data_root, derived["val_dataloader"]["dataset"], "val", sizes, derived["model"], seed=1
        )
        val = f"{len(sizes)} val images of {len(set(sizes))} sizes ({where})"
    result["notes"].append(
        f"data: synthetic {written['type']} ({written['labels']} labels, ignore index "
        f"{written['ignore_index']}, {written['count']} train images of {side} px, {val}) "
        "through the config's own pipelines; data loaders with num_workers=0"
    )
    for note in result["notes"]:
        echo(f"note: {note}")
    # Under rehearsal/: the runner dumps the config it ran into the work dir by its name.
    rehearsal_config = osp.join(work_dir, OUT_DIR, f"{stem}_rehearsal.py")
    os.makedirs(osp.dirname(rehearsal_config), exist_ok=True)
    Config(derived).dump(rehearsal_config)
    resume_config, note = _resume_config(cfg, data_root, iters, scale, rehearsal_config)
    if note:
        result["notes"].append(note)
        echo(f"note: {note}")

    device = "xla" if api == "gcu1" else "gcu"
    logs = [osp.join(work_dir, "train.log"), osp.join(work_dir, "resume.log")]
    result["logs"] = logs
    start = time.time()
    heap = host.heap_env(scale)
    echo(f"train: {ranks} card(s), {iters} iteration(s), checkpoint, validation ({logs[0]})")
    codes = [_launch(rehearsal_config, work_dir, ranks, hardware, [], logs[0], heap)]
    result["seconds"] = dict(train=round(time.time() - start, 1))
    checkpoint = last_checkpoint(work_dir)
    resumed: Dict[int, dict] = {}
    if codes[0] == 0 and checkpoint:
        start = time.time()
        echo(f"resume: from iteration {iters}, one more ({logs[1]})")
        extra = ["--resume", "--cfg-options", f"load_from={checkpoint}"]
        extra += [f"train_cfg.max_iters={iters + 1}", f"train_cfg.val_begin={iters + 2}"]
        # no save at the end (save_last) nor on the interval: iteration iters + 1 is not
        # a multiple of iters + 2
        extra += ["default_hooks.checkpoint.save_last=False"]
        extra += [f"default_hooks.checkpoint.interval={iters + 2}"]
        codes.append(_launch(resume_config, work_dir, ranks, hardware, extra, logs[1], heap))
        result["seconds"]["resume"] = round(time.time() - start, 1)
        resumed = report.read_ranks(work_dir, "resume")
    trained = report.read_ranks(work_dir, "train")
    result["phases"] = report.phases_of(
        trained, resumed, ranks, iters, device, checkpoint, changes["has_val"]
    )
    result["summary"] = report.summarise(
        trained, resumed, ranks, int(card_memory_gib * GIB), changes["factor"]
    )
    if scale == "real":
        result["memory"] = _memory(work_dir, result, cards, card_memory_gib)
    failed = next((p for p in result["phases"] if p["status"] == "failed"), None)
    if failed is None and all(code == 0 for code in codes):
        return finish()
    log = logs[len(codes) - 1] if failed is None or failed["name"] == "resume" else logs[0]
    with open(log) as f:
        text = f.read()
    if failed is not None and failed["name"] == "build" and report.in_wrap_model(text):
        # the runner built the model and failed putting it on the card or wrapping it
        result["phases"][0]["status"] = "passed"
        failed = result["phases"][1]
        failed["status"] = "failed"
    message = report.first_error(text) or (failed or {}).get("detail")
    name = failed["name"] if failed else "end"
    return finish(name, message or f"exit status {codes[-1]}")


def _resume_config(
    cfg, data_root: str, iters: int, scale: str, config: str
) -> Tuple[str, Optional[str]]:
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


def _memory(work_dir: str, result: dict, world: int, card_memory_gib: float) -> Optional[dict]:
    """The per-card figure for ``world`` ranks (:func:`~.memory.per_card`) from rank 0's
    train job, or None where it did not finish its first iteration."""
    facts = memory.read(work_dir, 0, "train")
    peak = (result["summary"] or {}).get("peak_bytes", 0)
    card = int(card_memory_gib * GIB)
    return memory.per_card(facts, peak, world, card) if facts else None
