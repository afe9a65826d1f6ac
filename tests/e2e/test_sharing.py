"""Two jobs on one node: a second job on the cards or the work dir of a running job stops
before training, naming it (pid, work dir), and the running job is unharmed; two jobs on
disjoint cards, started with tools/dist_train.sh, both train to their end.

The first job is a torchrun job of stock mmseg ``tools/train.py`` on two of four simulated
cards, held after its first iteration; the second ones are started by hand, as an operator
would, while it runs.
"""

import os.path as osp
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, clean_env, one_worker
from tests.e2e.conftest import (
    LEG_API,
    fault_config,
    finish,
    mmseg_tool,
    probes,
    programs_env,
    train_job,
    wait_for,
    worker_pids,
)

pytestmark = [pytest.mark.e2e, one_worker(__name__)]


def single_process(cfg, work, **env):
    """Stock tools/train.py, one process (no launcher), on four simulated cards."""
    env = programs_env(MMGCU_SIMULATE=4, MMGCU_SIMULATE_API=LEG_API, OMP_NUM_THREADS=1, **env)
    return subprocess.Popen(
        [sys.executable, mmseg_tool("train.py"), cfg, "--work-dir", work],
        env=clean_env(**env),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def two_jobs(dataset, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sharing")
    release, work = tmp / "release", str(tmp / "first")
    hold = dict(type="WaitForFileHook", at=1, path=str(release))
    first = train_job(
        fault_config(tmp / "first.py", dataset, [dict(type="PidHook"), hold], max_iters=2),
        work,
        2,
        cards=4,
    )
    try:
        wait_for(osp.join(work, "holding_rank0"), first)
        second_cfg = fault_config(tmp / "second.py", dataset, [], max_iters=2)
        seconds = {  # started together, while the first job holds its cards and work dir
            "cards": single_process(second_cfg, str(tmp / "second")),  # card 0
            "work dir": single_process(second_cfg, work, TOPS_VISIBLE_DEVICES="3"),
        }
        refused = {name: finish(proc, timeout=180) for name, proc in seconds.items()}
        pids = worker_pids(work)
    finally:
        release.touch()
    code, out = finish(first, timeout=300)
    return dict(work=work, pids=pids, refused=refused, code=code, out=out)


@pytest.mark.parametrize(
    "second, what",
    [("cards", f"card 0 of {socket.gethostname()}"), ("work dir", "the work dir {work}")],
)
def test_a_second_job_is_refused_naming_the_first(two_jobs, second, what):
    code, out = two_jobs["refused"][second]
    work, pid = two_jobs["work"], two_jobs["pids"][0]
    assert code != 0, out[-4000:]
    expected = (
        f"mmgcu: {what.format(work=work)} is in use by another running job: pid {pid} "
        f"(rank 0, launcher pid "
    )
    assert expected in out, out[-4000:]
    assert f"work dir {work}." in out
    assert "Iter(train)" not in out and "Traceback" not in out


def test_the_first_job_is_unharmed(two_jobs):
    assert two_jobs["code"] == 0, two_jobs["out"][-4000:]
    assert {r["iter"] for r in probes(two_jobs["work"]).values()} == {2}
    assert "Iter(train) [2/2]" in two_jobs["out"]


def dist_train(cfg, work, cards):
    """``tools/dist_train.sh CFG 2`` on ``cards`` of four simulated cards, as the README
    starts a job (no PORT: the launcher chooses the rendezvous)."""
    env = programs_env(MMGCU_SIMULATE=4, MMGCU_SIMULATE_API=LEG_API, TOPS_VISIBLE_DEVICES=cards)
    env = clean_env(PYTHON=sys.executable, OMP_NUM_THREADS=1, **env)
    for name in ("NNODES", "NODE_RANK", "PORT"):
        env.pop(name, None)
    return subprocess.Popen(
        [osp.join(REPO, "tools", "dist_train.sh"), cfg, "2", "--work-dir", work],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.t20
def test_jobs_on_disjoint_cards_both_train_to_their_end(dataset, tmp_path):
    """torch 1.10's ``torchrun --standalone`` always uses localhost:29400: there the second
    job's launcher joins the rendezvous store of the first, which its launcher hosts, and
    dies when the first job ends ("failed to send a keep-alive heartbeat to the rendezvous").
    Each job has a rendezvous of its own."""
    go = {job: tmp_path / f"go_{job}" for job in "ab"}
    work = {job: str(tmp_path / job) for job in "ab"}
    jobs = {}
    try:
        for job, cards in (("a", "0,1"), ("b", "2,3")):  # A first: its launcher hosts first
            held = [dict(type="WaitForFileHook", at=1, path=str(go[job]))]
            cfg = fault_config(tmp_path / f"{job}.py", dataset, held, max_iters=2)
            jobs[job] = dist_train(cfg, work[job], cards)
            wait_for(osp.join(work[job], "holding_rank0"), jobs[job], timeout=600)
        go["a"].touch()
        a_code, a_out = finish(jobs["a"], timeout=600)
        # B's launcher beats its rendezvous every 5 s: on A's store, it would die now.
        time.sleep(20)
        assert jobs["b"].poll() is None, "B ended while held: " + jobs["b"].communicate()[0]
    finally:
        for path in go.values():
            path.touch()
    b_code, b_out = finish(jobs["b"], timeout=600)

    assert a_code == 0, a_out[-4000:]
    assert b_code == 0, b_out[-4000:]
    assert "keep-alive" not in b_out and "RendezvousConnectionError" not in b_out
    for job in "ab":
        assert {r["iter"] for r in probes(work[job]).values()} == {2}
