"""``torchrun --max_restarts=N`` with ``--resume`` survives a transient failure: a rank dies
once, torchrun restarts every rank, the job resumes from the newest checkpoint and ends at
``max_iters``. On torch 2.x the restarted ranks meet on the rendezvous store the agent
kept, where mmgcu's groups use keys of their own attempt (see ``mmgcu.runtime.dist``).

The job has its own rendezvous endpoint (torch 1.10's ``--standalone`` is always
localhost:29400, which another job on the host may hold).
"""

import os.path as osp
import re
import subprocess
import sys

import pytest

from tests.e2e.conftest import (
    LEG_API,
    REPO,
    checkpoints,
    clean_env,
    fault_config,
    free_port,
    mmseg_tool,
    probes,
    programs_env,
)

pytestmark = [pytest.mark.e2e, pytest.mark.t20]


def restartable_job(cfg, work, nproc=2, restarts=1):
    """torchrun of stock tools/train.py with --resume, restarted up to ``restarts`` times."""
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1"]
    cmd += [f"--nproc_per_node={nproc}", f"--max_restarts={restarts}"]
    cmd += ["--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}"]
    cmd += [mmseg_tool("train.py"), cfg, "--launcher", "pytorch", "--work-dir", work, "--resume"]
    env = clean_env(
        **programs_env(MMGCU_SIMULATE=nproc, MMGCU_SIMULATE_API=LEG_API, OMP_NUM_THREADS=1)
    )
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)


def test_a_rank_that_dies_once_is_restarted_and_the_job_ends(dataset, tmp_path):
    work = str(tmp_path / "work")
    dies = dict(type="FaultHook", mode="exit", at=3, rank=1, once=True)
    cfg = fault_config(
        tmp_path / "restart.py",
        dataset,
        [dies],
        max_iters=4,
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", by_epoch=False, interval=2)),
    )

    proc = restartable_job(cfg, work)

    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    # Attempt 0: rank 1 exits at iteration 3, after the checkpoint of iteration 2.
    assert osp.exists(osp.join(work, "fault_rank1"))
    assert re.search(r"failed \(exitcode: 3\) local_rank: 1", out), out[-6000:]
    # Attempt 1: every rank resumes from iteration 2 and trains to the end.
    assert out.count("resumed epoch: 0, iter: 2") == 1, out[-6000:]  # rank 0 logs it
    assert "Iter(train) [4/4]" in out
    assert checkpoints(work) == ["iter_2.pth", "iter_4.pth"]
    assert sorted(probes(work)) == [0, 1]  # both ranks of the restarted attempt ended
    assert "connectFullMesh" not in out
