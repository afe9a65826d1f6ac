"""Checkpoints that a crash cannot all lose, and a ``--resume`` that is never silent.

A torchrun job of stock mmseg ``tools/train.py`` on simulated cards is killed while rank 0
writes a checkpoint (``max_keep_ckpts=1``, a save slower than the collective timeout), then
resumed; single-process programs cover a disk that fills up mid-write and the work-dir
states a crash or an operator leaves behind.
"""

import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, clean_env, last_json, one_worker, running
from tests.e2e.conftest import (
    LEG_API,
    PROGRAMS,
    checkpoints,
    fault_config,
    finish,
    probes,
    programs_env,
    root_cause,
    train_job,
    wait_for,
    worker_pids,
)

pytestmark = [pytest.mark.e2e, one_worker(__name__)]

TIMEOUT = 10  # env_cfg.dist_cfg.timeout of the killed run: shorter than rank 0's save
SAVE_S = 60  # rank 0's save of iteration 4 takes this long; it is killed before the end


def read(path):
    with open(path) as f:
        return f.read()


def program(name, *args, **env):
    """Run ``programs/NAME`` in one process on the simulated card; return its output."""
    env = programs_env(MMGCU_SIMULATE=1, MMGCU_SIMULATE_API=LEG_API, OMP_NUM_THREADS=1, **env)
    return subprocess.run(
        [sys.executable, osp.join(PROGRAMS, name), *map(str, args)],
        env=clean_env(**env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


# -- killed while rank 0 saves, then resumed ------------------------------------------


def kill_rank_0_in_its_save(proc, work):
    """Once rank 0 has been in its save for longer than the collective timeout, SIGKILL it.
    Returns whether every rank was still running then, and how long rank 0 had saved."""
    saving = wait_for(osp.join(work, "saving_rank0"), proc)
    time.sleep(max(0.0, saving + TIMEOUT + 5 - time.time()))
    pids = worker_pids(work)
    alive = proc.poll() is None and all(running(p) for p in pids.values())
    in_save = time.time() - saving
    os.kill(pids[0], signal.SIGKILL)
    return alive, in_save


@pytest.fixture(scope="module")
def killed_during_a_save(dataset, tmp_path_factory):
    """Two ranks, checkpoints every 2 iterations, one kept. Rank 0's save at iteration 4
    outlasts the collective timeout; rank 0 is killed in it. Then, as an older crash may
    leave it, ``last_checkpoint`` is removed and a partial file planted; ``--resume``."""
    tmp = tmp_path_factory.mktemp("killed")
    work = str(tmp / "work")
    keep_one = dict(checkpoint=dict(type="CheckpointHook", interval=2, by_epoch=False))
    keep_one["checkpoint"]["max_keep_ckpts"] = 1
    hooks = [dict(type="SaveRecorderHook"), dict(type="PidHook")]
    killed_cfg = fault_config(
        tmp / "killed.py",
        dataset,
        [*hooks, dict(type="SlowSaveHook", at=4, seconds=SAVE_S)],
        max_iters=6,
        default_hooks=keep_one,
        env_cfg=dict(dist_cfg=dict(timeout=TIMEOUT), watchdog=dict(interval=1)),
    )
    proc = train_job(killed_cfg, work, 2)
    alive_while_saving, in_save = kill_rank_0_in_its_save(proc, work)
    killed_code, killed_out = finish(proc, timeout=120)
    after_kill = sorted(os.listdir(work))
    last_after_kill = read(osp.join(work, "last_checkpoint"))
    with open(osp.join(work, ".iter_4.pth.partial"), "wb") as f:
        f.write(b"PK\x03\x04 half a checkpoint")
    os.remove(osp.join(work, "last_checkpoint"))
    resume_cfg = fault_config(tmp / "resume.py", dataset, hooks, 6, default_hooks=keep_one)
    code, out = finish(train_job(resume_cfg, work, 2, "--resume"), timeout=300)
    return dict(
        work=work,
        alive_while_saving=alive_while_saving,
        in_save=in_save,
        killed_code=killed_code,
        killed_out=killed_out,
        after_kill=after_kill,
        last_after_kill=last_after_kill,
        code=code,
        out=out,
    )


def test_a_save_slower_than_the_collective_timeout_harms_no_rank(killed_during_a_save):
    run = killed_during_a_save
    print(f"rank 0 was {run['in_save']:.0f} s in its save (collective timeout {TIMEOUT} s)")
    assert run["in_save"] > TIMEOUT + 2
    assert run["alive_while_saving"], run["killed_out"][-4000:]
    assert "Timed out" not in run["killed_out"]
    assert "the job is stuck" not in run["killed_out"]


@pytest.mark.t20  # the legacy path on the T20 stack too
def test_a_kill_during_a_save_keeps_the_previous_checkpoint(killed_during_a_save):
    run = killed_during_a_save
    assert run["killed_code"] != 0
    assert root_cause(run["killed_out"]) == (0, -9), run["killed_out"][-4000:]
    assert "Saving checkpoint at 4 iterations" in run["killed_out"]
    # max_keep_ckpts=1: mmengine's CheckpointHook would have deleted iter_2.pth already.
    assert [n for n in run["after_kill"] if n.endswith(".pth")] == ["iter_2.pth"]
    assert not [n for n in run["after_kill"] if "partial" in n], run["after_kill"]
    assert run["last_after_kill"] == osp.join(run["work"], "iter_2.pth")


def test_resume_without_last_checkpoint_takes_the_newest_complete_one(killed_during_a_save):
    import torch

    run = killed_during_a_save
    work, out = run["work"], run["out"]
    assert run["code"] == 0, out[-4000:]
    assert (
        f"mmgcu: --resume: {work}/last_checkpoint does not exist; resuming from the newest "
        f"complete checkpoint, {work}/iter_2.pth" in out
    ), out[-4000:]
    assert "resumed epoch: 0, iter: 2" in out
    assert "Iter(train) [3/6]" in out and "Iter(train) [1/6]" not in out
    # The killed save's leftover is gone, and the lock of the killed job did not stay.
    assert "removed 1 partial checkpoint file(s)" in out and ".iter_4.pth.partial" in out
    assert not [n for n in os.listdir(work) if "partial" in n]
    assert checkpoints(work) == ["iter_6.pth"]
    assert {r["iter"] for r in probes(work).values()} == {6}
    ckpt = torch.load(osp.join(work, "iter_6.pth"), map_location="cpu", weights_only=False)
    assert ckpt["meta"]["iter"] == 6 and ckpt["state_dict"] and ckpt["optimizer"]


def test_only_rank_0_writes_checkpoints(killed_during_a_save):
    """Every rank's CheckpointHook asks; GCURunner.save_checkpoint lets rank 0 alone save."""
    work = killed_during_a_save["work"]
    assert not osp.exists(osp.join(work, "saves_rank1.txt")), "rank 1 saved a checkpoint"
    assert read(osp.join(work, "saves_rank0.txt")).split("\n")[:-1] == [
        "save iter 2",
        "write .iter_2.pth.partial",
        "save iter 4",  # killed here
        "save iter 4",
        "write .iter_4.pth.partial",
        "save iter 6",
        "write .iter_6.pth.partial",
    ]


# -- a write that fails half-way (a full disk) ----------------------------------------


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path):
    """With max_keep_ckpts=1, which makes mmengine's CheckpointHook delete the previous
    checkpoint before the new one is written."""
    import torch

    result = last_json(program("half_write.py", WORK_DIR=tmp_path, KEEP=1).stdout)
    assert result["error"] == "[Errno 28] No space left on device"
    assert result["calls"] == [".iter_2.pth.partial", ".iter_4.pth.partial"]
    assert "iter_2.pth" in result["files"] and "iter_4.pth" not in result["files"]
    assert ".iter_4.pth.partial" not in result["files"]  # the half-written file is removed
    assert result["last"] == str(tmp_path / "iter_2.pth")
    ckpt = torch.load(tmp_path / "iter_2.pth", map_location="cpu", weights_only=False)
    assert ckpt["meta"]["iter"] == 2


# -- what --resume does with each state of a work dir -----------------------------------


@pytest.fixture(scope="module")
def resumed_cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume_cases")
    proc = program("resume_cases.py", root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root, last_json(proc.stdout), proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "case, why",
    [
        ("last_checkpoint missing", "last_checkpoint does not exist"),
        ("last_checkpoint empty", "last_checkpoint is empty"),
        ("last_checkpoint names a deleted file", "iter_6.pth, which does not exist"),
    ],
)
@pytest.mark.t20  # the legacy path on the T20 stack too
def test_resume_never_restarts_from_zero_over_checkpoints(resumed_cases, case, why):
    root, results, log = resumed_cases
    assert results[case] == dict(start=4, end=6), results[case]
    work = osp.join(root, case.replace(" ", "_"))
    note = f"{why}; resuming from the newest complete checkpoint, {work}/iter_4.pth"
    assert note in log


@pytest.mark.t20  # the legacy path on the T20 stack too
def test_a_damaged_checkpoint_is_named_with_the_newest_good_one(resumed_cases):
    root, results, _ = resumed_cases
    work = osp.join(root, "newest_checkpoint_empty")
    assert results["newest checkpoint empty"]["error"] == (
        f"the checkpoint {work}/iter_4.pth is damaged: it is empty (0 bytes). The newest "
        f"complete checkpoint is {work}/iter_2.pth: delete iter_4.pth and run with --resume "
        "again (mmgcu then resumes from iter_2.pth), or resume from it directly with --resume "
        f"--cfg-options load_from={work}/iter_2.pth"
    )
    assert "No complete checkpoint is left" in results["every checkpoint damaged"]["error"]


def test_resume_in_an_empty_work_dir_says_it_starts_at_zero(resumed_cases):
    root, results, log = resumed_cases
    assert results["no checkpoint"] == dict(start=0, end=6)
    assert f"{root}/no_checkpoint holds no checkpoint: training starts at iteration 0" in log


def test_a_smaller_global_batch_on_resume_is_told_with_its_lr(resumed_cases):
    _, results, log = resumed_cases
    assert results["smaller batch"] == dict(end=6)
    assert (
        "mmgcu: the checkpoint was trained with a global batch of 2 (1 rank(s) x 2); this run "
        "trains with 1 (1 rank(s) x 1). The learning rate comes back from the checkpoint "
        "unchanged (lr=0.1, chosen for a batch of 2); the linear scaling rule would give "
        "lr=0.05" in log
    )
    assert "auto_scale_lr=dict(enable=True, base_batch_size=2)" in log
