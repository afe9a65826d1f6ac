"""Bad inputs: each stops in seconds, before training, with one line naming the fix.

One table, one row per mistake. Every row starts real processes on the simulated cards
(stock mmseg ``tools/train.py`` under torchrun or started by hand, or the runner from a
snippet where ``tools/train.py`` cannot express the mistake) and asserts that

- the job fails (exit code != 0) within a minute, and no training iteration ran;
- a rank printed mmgcu's one-line form ``mmgcu: <message>``, and that message names what
  was found, what was expected and the fix (the row's fragments);
- no rank printed a Python traceback for it.

Each row's ``stock`` says what happens without mmgcu's check; every row fails if the check
is removed, because nothing else prints its message. ``test_without_the_check`` proves the
cheap ones by running them with the check switched off.
"""

import glob
import os
import os.path as osp
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import pytest

from tests.conftest import REPO, clean_env
from tests.e2e.conftest import (
    LEG_API,
    LEG_DEVICE,
    free_port,
    mmseg_tool,
    probes,
    torchrun,
    write_config,
)

pytestmark = pytest.mark.e2e

TRACEBACK = "Traceback (most recent call last)"
FAST = 60  # seconds: every mistake must be reported in less

PROGRAMS = osp.join(osp.dirname(osp.abspath(__file__)), "programs")
# Modules the configs of some rows import (its folder is put on PYTHONPATH).
BAD_MODULES = osp.join(PROGRAMS, "bad_modules.py")
IMPORT_BAD_MODULES = dict(
    imports=["mmgcu", "tests.e2e.probe", "bad_modules"], allow_failed_imports=False
)

BUILD_RUNNER = osp.join(PROGRAMS, "build_runner.py")


@pytest.fixture(scope="module", autouse=True)
def simulator_built():
    """Build the simulator's extension first, so no row's time includes compiling it."""
    subprocess.run(
        [sys.executable, "-m", "mmgcu.sim.build"],
        env=clean_env(MMGCU_SIMULATE=1),
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=600,
    )


@dataclass
class Row:
    id: str
    expect: Tuple[str, ...]  # fragments of the one 'mmgcu: ...' line: found, expected, fix
    stock: str  # what happens without mmgcu's check
    launch: str = "train.py"  # 'torchrun', 'train.py' (started by hand) or 'snippet'
    ranks: int = 1
    cards: Optional[int] = 2  # simulated cards; None: no torch_gcu at all
    api: str = LEG_API
    launcher: str = "pytorch"
    env: Dict[str, Optional[str]] = field(default_factory=dict)  # None unsets a variable
    rank_env: Tuple[Dict[str, str], ...] = ()  # per hand-started rank
    cfg: dict = field(default_factory=dict)
    failing: Optional[Tuple[int, ...]] = None  # the ranks that must report it; None: all


OTHER_API = "gcu2" if LEG_API == "gcu1" else "gcu1"
OTHER = {"gcu1": ("1.x", "2.x"), "gcu2": ("2.x", "1.x")}[OTHER_API]
ECCL_MISSING = {"gcu2": "no 'eccl' backend", "gcu1": "is_eccl_available() is False"}

ROWS = [
    Row(
        "more-ranks-than-cards",
        launch="torchrun",
        ranks=3,
        expect=("3 ranks were launched", "only 2 GCU card(s)", "--nproc_per_node=2"),
        stock="rank 2 dies in torch_gcu set_device(2) with 'GCU device ordinal 2 is "
        "invalid' and a traceback (stock mmengine dies earlier, in torch.cuda.set_device)",
    ),
    Row(
        "two-ranks-on-one-card",
        ranks=2,
        rank_env=({}, {"LOCAL_RANK": "0"}),
        expect=("ranks 0 and 1 both run on card 0", "two ranks on one card", "LOCAL_RANK"),
        stock="both ranks train on card 0: twice the memory and half the speed of one "
        "card, and card 1 idles; nothing fails (see test_without_the_check)",
    ),
    Row(
        "local-rank-missing",
        launch="snippet",
        env={"LOCAL_RANK": None, "LOCAL_WORLD_SIZE": None},
        expect=("LOCAL_RANK is not set", "cannot choose its card", "--launcher pytorch"),
        stock="stock mmengine's _init_dist_pytorch: KeyError: 'LOCAL_RANK' with a traceback",
    ),
    Row(
        "local-rank-out-of-range",
        env={"LOCAL_RANK": "5"},
        expect=("local rank 5 has no card", f"2 {LEG_DEVICE} card(s) visible", "0..1", "at most 2"),
        stock="set_device(5) fails in torch_gcu with 'GCU device ordinal 5 is invalid' "
        "and a traceback",
    ),
    Row(
        "visible-devices-fewer-than-ranks",
        launch="torchrun",
        ranks=2,
        env={"TOPS_VISIBLE_DEVICES": "0"},
        expect=("2 ranks were launched", "only 1 GCU card(s)", "TOPS_VISIBLE_DEVICES"),
        stock="rank 1 dies in set_device(1): 'GCU device ordinal 1 is invalid' traceback",
    ),
    Row(
        "visible-devices-empty",
        launch="torchrun",
        ranks=2,
        env={"TOPS_VISIBLE_DEVICES": ""},
        expect=(
            "no card is visible to local rank",
            "TOPS_VISIBLE_DEVICES is set but empty",
            "unset the variable to use every card",
        ),
        stock="the simulated torch_gcu cannot start without a card: 'RuntimeError: simulate "
        "1..64 cards' with a traceback on every rank (and tools/dist_train.sh called the "
        "variable unset)",
    ),
    Row(
        "device-of-the-other-generation",
        launcher="none",
        cfg=dict(env_cfg=dict(device=OTHER_API)),
        expect=(f"demands torch_gcu {OTHER[0]}", "installed torch_gcu is", OTHER[1], "'auto'"),
        stock="nothing reads env_cfg.device: the run trains on whatever is found",
    ),
    Row(
        "device-gcu-without-torch-gcu",
        launcher="none",
        cards=None,
        cfg=dict(env_cfg=dict(device="gcu")),
        expect=("demands a GCU", "torch_gcu is not importable", "Install torch_gcu"),
        stock="nothing reads env_cfg.device: the run trains on the CPU, for days",
    ),
    Row(
        "device-ids-in-wrapper-cfg",
        launch="torchrun",
        ranks=2,
        cfg=dict(model_wrapper_cfg=dict(device_ids=[1])),
        expect=(
            "model_wrapper_cfg.device_ids=[1]",
            "each rank trains on its own card",
            "cannot name for every rank",
            "Remove device_ids from model_wrapper_cfg",
        ),
        # One config serves every rank, so both refuse it, rank 1 (whose card is 1) too.
        failing=(0, 1),
        stock="torch DDP on rank 0: 'device_ids and output_device arguments only work with "
        "single-device/multiple-device GPU modules...' traceback; ranks may hang in the "
        "first broadcast",
    ),
    Row(
        "params-created-after-wrapping",
        launch="torchrun",
        ranks=2,
        cfg=dict(custom_imports=IMPORT_BAD_MODULES, model=dict(type="LateParamSegmentor")),
        expect=("1 parameter(s)/buffer(s) are not on", "extra on cpu", "Create parameters"),
        stock="the parameter stays on the CPU, outside DDP and the optimizer; training "
        "goes on without error (see test_without_the_check)",
    ),
    Row(
        "batch-left-on-cpu",
        launcher="none",
        cfg=dict(
            custom_imports=IMPORT_BAD_MODULES,
            model=dict(data_preprocessor=dict(type="CpuBatchPreProcessor")),
        ),
        expect=("data preprocessor (CpuBatchPreProcessor)", "on cpu", "cast_data"),
        stock="the first convolution fails with a deep traceback: 'Input type "
        "(torch.FloatTensor) and weight type (gcuFloatType) should be the same' "
        "(see test_without_the_check)",
    ),
    Row(
        "unknown-launcher",
        launch="snippet",
        launcher="horovod",
        expect=("unknown launcher 'horovod'", "pytorch, slurm, mpi", "'none'"),
        stock="stock mmengine's init_dist: 'ValueError: Invalid launcher type: horovod' "
        "with a traceback",
    ),
    Row(
        "eccl-missing",
        env={"MMGCU_SIMULATE_ECCL": "0"},
        expect=("ECCL is not available", ECCL_MISSING[LEG_API], "Install the ECCL package"),
        stock="init_process_group fails inside torch.distributed (2.x: 'Invalid backend: "
        "eccl') or torch_gcu.distributed (1.x: 'Distributed package doesn't have ECCL "
        "built in') with a traceback",
    ),
]


@dataclass
class Result:
    codes: list  # every process's exit code (torchrun: the agent's)
    ranks: list  # each rank's own stdout and stderr
    console: str  # everything, for failure messages
    elapsed: float
    stopped: tuple = ()  # ranks torchrun's agent stopped, still starting, at another's failure


# torchrun's failure summary names each rank that exited on its own (torch 1.10 and 2.x):
#   rank      : 1 (local_rank: 1)
FAILED_RANK = re.compile(r"^\s*rank\s*: (\d+) \(local_rank: \d+\)", re.M)


def stopped_while_starting(console, outputs):
    """The ranks the agent stopped before they had started: at a rank's failure it ends the
    others and lists only the ranks that had failed. Monitoring every 0.1 s (torch 2's
    default, and mmgcu's flags on 1.10), it may stop a rank that was slow to start before
    that rank reached the check. A rank that had logged through mmengine had started: it
    must have reported (a rank that waits in a collective instead is a failure)."""
    failed = {int(m.group(1)) for m in FAILED_RANK.finditer(console)}
    return tuple(
        rank
        for rank, out in enumerate(outputs)
        if failed and rank not in failed and " - mmengine - " not in out
    )


def start(row, tmp_path, dataset, cfg_extra=None, script=None):
    """Run ``row`` in real processes; return once they have all exited.

    ``cfg_extra`` adds config keys; ``script`` (a list) replaces ``[tools/train.py]``.
    """
    cfg = write_config(tmp_path / f"{row.id}.py", dataset, **{**row.cfg, **(cfg_extra or {})})
    work = str(tmp_path / "work")
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{PROGRAMS}", **row.env}
    script = script or [mmseg_tool("train.py")]
    if row.launch == "snippet":
        argv = [BUILD_RUNNER, cfg, work, row.launcher]
    else:
        argv = [*script, cfg, "--launcher", row.launcher, "--work-dir", work]
    started = time.time()
    stopped = ()
    if row.launch == "torchrun":
        codes, ranks, console = under_torchrun(row, argv, env, str(tmp_path / "logs"))
        stopped = stopped_while_starting(console, ranks)
    else:
        codes, ranks = by_hand(row, argv, env)
        console = "\n".join(ranks)
    return Result(codes, ranks, console, time.time() - started, stopped)


def communicate(proc, timeout=300):
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()[0] + f"\n<killed after {timeout} s>"


def under_torchrun(row, argv, env, logs):
    """torchrun, with each rank's output also in its own file (--tee) to read back."""
    args = ["--log_dir", logs, "--tee", "3", *argv]  # torch 1.10 knows only --log_dir
    proc = torchrun(args, nproc=row.ranks, cards=row.cards, api=row.api, extra_env=env)
    console = communicate(proc)
    ranks = []
    for rank in range(row.ranks):
        files = sorted(glob.glob(osp.join(logs, "*", "attempt_0", str(rank), "std*.log")))
        ranks.append("".join(open(p).read() for p in files))
    return [proc.returncode], ranks, console


def by_hand(row, argv, env):
    """One process per rank, with the launcher variables a launcher would set."""
    env = dict(env, OMP_NUM_THREADS="1")  # as torchrun() sets it
    if row.cards is not None:
        env.update(MMGCU_SIMULATE=str(row.cards), MMGCU_SIMULATE_API=row.api)
    if row.launcher != "none":
        launch = dict(WORLD_SIZE=row.ranks, LOCAL_WORLD_SIZE=row.ranks)
        launch.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
        env = {**{k: str(v) for k, v in launch.items()}, **env}
    procs = []
    for rank in range(row.ranks):
        mine = dict(RANK=str(rank), LOCAL_RANK=str(rank)) if row.launcher != "none" else {}
        mine.update(env)
        mine.update(row.rank_env[rank] if row.rank_env else {})
        full = clean_env(**{k: v for k, v in mine.items() if v is not None})
        for name in [k for k, v in mine.items() if v is None]:
            full.pop(name, None)
        procs.append(
            subprocess.Popen(
                [sys.executable, *argv],
                env=full,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [communicate(p) for p in procs]
    return [p.returncode for p in procs], outs


# mmgcu's one-line report; torch >= 2.2 prefixes what the excepthook prints with
# '[rankN]: ' once the process group exists.
ONE_LINE = re.compile(r"^(\[rank\d+\]: )?mmgcu: (?!torch_gcu is SIMULATED)")


def error_lines(output):
    """mmgcu's one-line reports in ``output`` (not the simulator's banner)."""
    return [line for line in output.splitlines() if ONE_LINE.match(line)]


@pytest.mark.t20  # the legacy path on the T20 stack too
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input_stops_with_one_clear_message(row, dataset, tmp_path):
    result = start(row, tmp_path, dataset)
    tail = result.console[-4000:]
    print(f"{row.id}: {result.elapsed:.1f} s")

    assert all(code != 0 for code in result.codes), (result.codes, tail)
    assert result.elapsed < FAST, f"{row.id} took {result.elapsed:.0f} s to fail"
    assert "Iter(train)" not in result.console, "training started:\n" + tail

    failing = row.failing if row.failing is not None else range(row.ranks)
    reporting = [rank for rank in failing if rank not in result.stopped]
    assert reporting, (result.stopped, tail)  # at least the first failure is a report
    for rank in reporting:
        out = result.ranks[rank]
        reports = error_lines(out)
        assert reports, f"no 'mmgcu: ...' line from rank {rank}:\n{out[-4000:]}"
        assert any(all(f in line for f in row.expect) for line in reports), (row.expect, reports)
        assert TRACEBACK not in out, f"rank {rank} printed a traceback:\n{out[-4000:]}"


# -- the contrast: the same mistakes with mmgcu's check switched off ------------------

# A short run is enough to show that training goes on: one iteration, no validation.
SHORT = dict(
    train_cfg=dict(max_iters=1, val_interval=100),
    val_cfg=None,
    val_dataloader=None,
    val_evaluator=None,
)

# tools/train.py with mmgcu's first-batch check removed (it has no config switch).
WITHOUT_BATCH_CHECK = osp.join(PROGRAMS, "train_without_batch_check.py")


def row(row_id):
    return next(r for r in ROWS if r.id == row_id)


def test_without_the_check_two_ranks_silently_share_a_card(dataset, tmp_path):
    result = start(
        row("two-ranks-on-one-card"), tmp_path, dataset, dict(SHORT, gcu_placement_check=False)
    )
    assert result.codes == [0, 0], result.console[-4000:]
    reports = probes(str(tmp_path / "work"))
    card = f"{LEG_DEVICE}:0"
    assert [r["param_devices"] for r in reports.values()] == [[card], [card]]


def test_without_the_check_a_cpu_parameter_silently_trains(dataset, tmp_path):
    result = start(
        row("params-created-after-wrapping"),
        tmp_path,
        dataset,
        dict(SHORT, gcu_placement_check=False),
    )
    assert result.codes == [0], result.console[-4000:]
    assert not [line for out in result.ranks for line in error_lines(out)]
    reports = probes(str(tmp_path / "work"))
    assert reports[0]["param_devices"] == ["cpu", f"{LEG_DEVICE}:0"], reports[0]


def test_without_the_check_a_cpu_batch_fails_deep_in_forward(dataset, tmp_path):
    bad = row("batch-left-on-cpu")
    result = start(
        bad, tmp_path, dataset, SHORT, script=[WITHOUT_BATCH_CHECK, mmseg_tool("train.py")]
    )
    assert result.codes[0] != 0
    assert TRACEBACK in result.console
    # PyTorch's words for a CPU input to a card's convolution, whichever check trips first.
    assert re.search(
        r"Expected all tensors to be on the same device|Input type \(torch\.FloatTensor\) "
        r"and weight type \((gcu|xla)FloatType\) should be the same",
        result.console,
    ), result.console[-4000:]
    assert not error_lines(result.console)
