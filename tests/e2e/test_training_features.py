"""Training features through stock mmseg tools on simulated cards: AMP, bf16, resume,
checkpoint portability, SyncBN, seeds, empty cache, distributed test, lazy step, fp16 val.

The runs are module fixtures shared by several tests (a run costs ~40 s on 2 ranks).
"""

import glob
import json
import os
import os.path as osp
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, clean_env, one_worker
from tests.e2e.conftest import (
    LEG_API,
    LEG_DEVICE,
    checkpoint_report,
    checkpoints,
    finish,
    mmseg_tool,
    probes,
    torchrun,
    write_config,
)

pytestmark = [pytest.mark.e2e, one_worker(__name__)]

MAX_ITERS = 4
PROBE = dict(type="ProbeHook")
# Shared by the AMP runs: stock hook name (mapped to GCUEmptyCacheHook), fp16 validation.
AMP_OVERRIDES = dict(
    custom_hooks=[PROBE, dict(type="EmptyCacheHook", after_iter=True)],
    val_cfg=dict(type="ValLoop", fp16=True),
)


class Run:
    """What one training (or test) job left: exit code, output, work dir, probe reports."""

    def __init__(self, code, out, work_dir):
        self.code = code
        self.out = out
        self.work_dir = work_dir
        self.probes = probes(work_dir)

    def ok(self, world=2):
        assert self.code == 0, self.out[-5000:]
        assert sorted(self.probes) == list(range(world)), self.out[-3000:]
        return self

    def each(self, key):
        return [self.probes[r][key] for r in sorted(self.probes)]

    def scalars(self):
        """The lines of ``<work_dir>/<timestamp>/vis_data/scalars.json`` (one run per dir)."""
        (path,) = glob.glob(osp.join(self.work_dir, "*", "vis_data", "scalars.json"))
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def train_lines(self):
        return [s for s in self.scalars() if "loss" in s]

    def losses(self):
        return [s["loss"] for s in self.train_lines()]

    def text_log(self):
        (path,) = glob.glob(osp.join(self.work_dir, "*", "*.log"))
        with open(path) as f:
            return f.read()


def train(work_dir, cfg, *flags, nproc=2, cards=2, timeout=600):
    """``torchrun tools/train.py CFG --launcher pytorch`` (stock mmseg) on simulated cards."""
    args = [mmseg_tool("train.py"), cfg, "--launcher", "pytorch", "--work-dir", str(work_dir)]
    proc = torchrun(args + list(flags), nproc=nproc, cards=cards)
    code, out = finish(proc, timeout=timeout)
    return Run(code, out, str(work_dir))


def single_process(script, *args, timeout=600, **env):
    """A tool script in one process, no launcher; ``env`` adds variables."""
    proc = subprocess.run(
        [sys.executable, script, *args],
        env=clean_env(OMP_NUM_THREADS=1, **env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout + proc.stderr


def distinct(values, ndigits=4):
    return {round(v, ndigits) for v in values}


# -- the runs (this leg's torch_gcu generation, see LEG_API) ---------------------------
@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("features")


@pytest.fixture(scope="module")
def amp_cfg(dataset, tmp):
    return write_config(tmp / "amp.py", dataset, **AMP_OVERRIDES)


@pytest.fixture(scope="module")
def plain_cfg(dataset, tmp):
    return write_config(tmp / "plain.py", dataset)


@pytest.fixture(scope="module")
def amp(amp_cfg, tmp):
    """2 ranks, --amp, seed 0, EmptyCacheHook, fp16 validation."""
    return train(tmp / "amp", amp_cfg, "--amp")


@pytest.fixture(scope="module")
def seed1_bn(plain_cfg, tmp):
    """As ``amp`` with seed 1, no EmptyCacheHook, and plain BN converted by ``sync_bn``."""
    return train(
        tmp / "seed1_bn",
        plain_cfg,
        "--amp",
        "--cfg-options",
        "randomness.seed=1",
        "sync_bn=torch",
        "model.backbone.norm_cfg.type=BN",
        "model.decode_head.norm_cfg.type=BN",
        "val_cfg.fp16=True",
    )


@pytest.fixture(scope="module")
def cpu_run(plain_cfg, tmp):
    """A plain CPU run: one process, no simulator, env_cfg.device=cpu."""
    work = str(tmp / "cpu")
    args = [plain_cfg, "--work-dir", work, "--cfg-options", "env_cfg.device=cpu"]
    code, out = single_process(mmseg_tool("train.py"), *args)
    return Run(code, out, work)


@pytest.fixture(scope="module")
def bf16(amp_cfg, cpu_run, tmp):
    """--amp in bfloat16 (validation stays fp16), with diff_rank_seed, starting from the CPU
    run's checkpoint (load_from)."""
    cpu_run.ok(world=1)
    return train(
        tmp / "bf16",
        amp_cfg,
        "--amp",
        "--cfg-options",
        "optim_wrapper.dtype=bfloat16",
        "randomness.diff_rank_seed=True",
        f"load_from={osp.join(cpu_run.work_dir, 'iter_4.pth')}",
    )


@pytest.fixture(scope="module")
def resumed(amp, amp_cfg, tmp):
    """amp's work dir (copied), continued with --resume to 8 iterations in bfloat16."""
    amp.ok()
    work = str(tmp / "resumed")
    shutil.copytree(amp.work_dir, work)
    for name in glob.glob(osp.join(work, "probe_rank*.json")):
        os.remove(name)
    with open(osp.join(work, "last_checkpoint"), "w") as f:
        f.write(osp.join(work, "iter_4.pth"))
    return train(
        work,
        amp_cfg,
        "--amp",
        "--resume",
        "--cfg-options",
        "optim_wrapper.dtype=bfloat16",
        "train_cfg.max_iters=8",
        "param_scheduler.0.end=8",
    )


LOGGED_EVERY_3 = dict(
    train_cfg=dict(type="IterBasedTrainLoop", max_iters=6, val_interval=6),
    default_hooks=dict(logger=dict(type="LoggerHook", interval=3, log_metric_by_epoch=False)),
)


@pytest.fixture(scope="module")
def logging_pair(dataset, tmp):
    """One seeded job run twice: scalars kept on the card until the log line (mmgcu), and
    read at every step (``gcu_defer_scalars=False``, as stock mmengine does)."""
    runs = {}
    for name, defer in (("deferred", True), ("stock_logging", False)):
        cfg = write_config(tmp / f"{name}.py", dataset, gcu_defer_scalars=defer, **LOGGED_EVERY_3)
        runs[name] = train(tmp / name, cfg)
    return runs


# -- 1. AMP -----------------------------------------------------------------------------
@pytest.mark.t20  # its run is the resumed one's start
def test_amp_flag_trains_in_fp16_on_cards(amp):
    """Without GCUAmpOptimWrapper, stock AmpOptimWrapper asserts CUDA or autocasts nothing."""
    run = amp.ok()
    for mro in run.each("optim_wrapper"):
        assert mro[0] == "GCUAmpOptimWrapper" and "AmpOptimWrapper" in mro, mro
    # Training and (fp16) validation logits are all half precision.
    assert run.each("logits_dtypes") == [["torch.float16"]] * 2
    lines = run.train_lines()
    assert len(lines) == MAX_ITERS
    assert all("memory" in s for s in lines), lines
    assert "memory: " in run.text_log()
    mode = {"gcu2": "skip", "gcu1": "zero"}[LEG_API]  # the generation's default
    assert (
        f"optimizer wrapper GCUAmpOptimWrapper (torch.float16, overflow step '{mode}')" in run.out
    )
    if LEG_API == "gcu1":
        # torch_gcu 1.x AMP: scaler.step/update, then one unlazy of the AMP outputs per step.
        assert run.each("graph_runs") == [MAX_ITERS] * 2
        assert run.each("lazy_steps") == [0, 0]


# -- 2. bfloat16 ------------------------------------------------------------------------
def test_bf16_amp(bf16):
    """Without dtype handling the decode head would autocast to fp16 (or not at all)."""
    run = bf16.ok()
    for dtypes in run.each("logits_dtypes"):
        assert "torch.bfloat16" in dtypes and "torch.float32" not in dtypes, dtypes
    assert run.each("optim_wrapper")[0][0] == "GCUAmpOptimWrapper"


def test_amp_in_float32_fails_fast(amp_cfg, tmp):
    """Without the dtype check the run would start training in a dtype autocast refuses."""
    args = ("--amp", "--cfg-options", "optim_wrapper.dtype=float32")
    run = train(tmp / "fp32_amp", amp_cfg, *args, nproc=1, cards=1)
    assert run.code != 0
    # The config dump names float32 too: look for the error itself (mmgcu prints a
    # GCUError as "mmgcu: <message>", other errors keep their "XError: ..." line).
    assert re.search(r"(Error|mmgcu): [^\n]*float32", run.out), run.out[-5000:]
    assert "Iter(train)" not in run.out, "it trained before failing"
    assert not run.probes


# -- 3. resume --------------------------------------------------------------------------
@pytest.mark.t20
def test_resume_in_another_dtype_continues_and_checkpoint_loads_on_cpu(resumed):
    """A card-bound checkpoint (rank 1 loads what rank 0 saved from card 0), a resume that
    restarts, a scaler state that does not resume, or a refused dtype fails here."""
    run = resumed.ok()
    assert "resumed epoch: 0, iter: 4" in run.out, run.out[-5000:]
    assert "Iter(train) [5/8]" in run.out and "Iter(train) [1/8]" not in run.out
    mode = {"gcu2": "skip", "gcu1": "zero"}[LEG_API]
    assert (
        f"optimizer wrapper GCUAmpOptimWrapper (torch.bfloat16, overflow step '{mode}')" in run.out
    )
    assert "iter_8.pth" in checkpoints(run.work_dir)
    assert run.each("iter") == [8, 8]
    report = checkpoint_report(osp.join(run.work_dir, "iter_8.pth"))
    assert report["bad"] == [], report
    assert report["iter"] == 8
    assert report["momentum"] > 0 and report["tensors"] > report["momentum"]
    for key in ("state_dict", "optimizer", "message_hub", "param_schedulers"):
        assert key in report["keys"], report


# -- 4. CPU checkpoint onto cards ---------------------------------------------------------
def test_cpu_checkpoint_loads_onto_cards(cpu_run, bf16):
    """A load that failed, or left CPU tensors in a card model, would stop the run."""
    assert cpu_run.each("param_devices") == [["cpu"]]
    run = bf16.ok()
    assert "Load checkpoint from " + osp.join(cpu_run.work_dir, "iter_4.pth") in run.out
    for rank, r in run.probes.items():
        assert r["param_devices"] == [f"{LEG_DEVICE}:{rank}"], r
        assert r["buffer_devices"] == [f"{LEG_DEVICE}:{rank}"], r


# -- 5. SyncBN --------------------------------------------------------------------------
def test_sync_bn_keeps_bn_statistics_equal(amp, seed1_bn):
    """Without SyncBN the ranks (on different data) end with different BN statistics."""
    assert len(distinct(amp.ok().each("buffer_checksum"))) == 1
    # sync_bn=torch converts a plain-BN model, which then syncs as well.
    assert len(distinct(seed1_bn.ok().each("buffer_checksum"))) == 1


# -- 6. seeds ---------------------------------------------------------------------------
def test_seeds_make_runs_repeatable(amp, seed1_bn, logging_pair, bf16):
    """Unseeded, reruns would differ; with the seed ignored, seed=1 would repeat seed=0."""
    # The logging pair is one seeded job run twice (6 iterations, a loss logged every 3).
    again = [run.ok().losses() for run in logging_pair.values()]
    assert len(again[0]) == 2 and again[0] == again[1], again
    losses = amp.ok().losses()
    other = seed1_bn.ok().losses()
    assert len(other) == MAX_ITERS and other[0] != losses[0], (other, losses)
    # diff_rank_seed=True runs (its per-rank seeds are not observable from the probe).
    bf16.ok()


# -- logged scalars: read once per log line, the values stock logging records ----------
TIMING = ("time", "data_time", "memory", "eta")


@pytest.mark.t20  # the legacy path on the T20 stack too
def test_deferred_scalars_log_what_stock_logging_logs(logging_pair):
    """The same seeded run, scalars kept on the card (mmgcu) and read at every step
    (``gcu_defer_scalars=False``, stock mmengine): scalars.json, key order included, is
    the same but for the timings."""
    deferred, stock = (
        [[(k, v) for k, v in line.items() if k not in TIMING] for line in run.ok().scalars()]
        for run in (logging_pair["deferred"], logging_pair["stock_logging"])
    )
    assert [line[-1] for line in stock] == [("step", 3), ("step", 6), ("step", 6)], stock
    assert deferred == stock


# -- 7. empty cache ---------------------------------------------------------------------
def test_empty_cache_hook_empties_card_cache(amp, seed1_bn):
    """Stock EmptyCacheHook empties only CUDA's cache: the card count would stay 0."""
    if LEG_API == "gcu1":  # torch_gcu 1.x has no empty_cache: the hook says so, once
        assert amp.ok().each("empty_cache_calls") == [0, 0]
        assert amp.text_log().count("has no cache to empty") == 1
        return
    assert all(n >= MAX_ITERS for n in amp.ok().each("empty_cache_calls")), amp.probes
    assert seed1_bn.ok().each("empty_cache_calls") == [0, 0]


# -- 8. distributed evaluation ----------------------------------------------------------
# mmseg 1.2.2's own tools/test.py ignores runner_type (a plain Runner: CUDA set-up under a
# launcher, the CPU in one process); the project's tools/test.py is that script honouring it.
TEST_SCRIPT = osp.join(REPO, "tools", "test.py")


def last_metrics(out):
    """aAcc, mIoU and mAcc of the last metrics line (mIoU alone would hide little here)."""
    found = re.findall(r"aAcc: ([0-9.]+)\s+mIoU: ([0-9.]+)\s+mAcc: ([0-9.]+)", out)
    assert found, out[-5000:]
    return tuple(float(v) for v in found[-1])


def test_distributed_test_matches_single_process(amp, amp_cfg, tmp):
    """A rank that dropped or double-counted its share of images would change mIoU (16
    images on 3 ranks: the sampler pads the last share with repeats, which must not count)."""
    ckpt = osp.join(amp.ok().work_dir, "iter_4.pth")
    proc = torchrun(
        [TEST_SCRIPT, amp_cfg, ckpt, "--launcher", "pytorch"] + ["--work-dir", str(tmp / "test3")],
        nproc=3,
        cards=3,
    )
    code3, out3 = finish(proc)
    code1, out1 = single_process(
        TEST_SCRIPT,
        amp_cfg,
        ckpt,
        "--work-dir",
        str(tmp / "test1"),
        MMGCU_SIMULATE=1,
        MMGCU_SIMULATE_API=LEG_API,
    )
    assert code3 == 0, out3[-5000:]
    assert code1 == 0, out1[-5000:]
    # Both evaluated on the cards (GCURunner's placement check ran), not on the CPU.
    assert f"mmgcu: {LEG_API} (" in out3 and "rank 2 on " in out3, out3[-5000:]
    assert f"mmgcu: {LEG_API} (" in out1, out1[-5000:]
    assert last_metrics(out3) == last_metrics(out1)


# -- 9. torch_gcu 1.x lazy step with accumulation --------------------------------------
@pytest.mark.t20
@pytest.mark.skipif(LEG_API != "gcu1", reason="torch_gcu 2.x steps eagerly: no lazy graph")
def test_lazy_step_once_per_accumulated_step(plain_cfg, tmp):
    """One graph run per optimizer step: the iteration that only accumulates gradients
    leaves its graph (and what it logged) to the step's."""
    run = train(
        tmp / "accum",
        plain_cfg,
        "--cfg-options",
        "optim_wrapper.accumulative_counts=2",
    ).ok()
    assert run.each("optim_wrapper")[0][0] == "GCUOptimWrapper"
    assert run.each("unlazy_calls") == [MAX_ITERS // 2] * 2
    assert run.each("graph_runs") == [MAX_ITERS // 2] * 2


# -- 10. fp16 validation ----------------------------------------------------------------
def test_fp16_validation_autocasts_on_card(bf16):
    """Stock ValLoop autocasts on 'cpu': validation logits on the card would be fp32."""
    run = bf16.ok()
    assert "mIoU" in run.out
    # Training autocasts to bfloat16, so float16 logits come from validation alone.
    assert run.each("logits_dtypes") == [["torch.bfloat16", "torch.float16"]] * 2
