"""The launch scripts on simulated cards: training, testing, and stopping a run."""

import glob
import os
import re
import signal
import subprocess
import time

import pytest

from tests.conftest import one_worker, running
from tests.e2e.conftest import checkpoints, probes, write_config
from tests.tools.conftest import TOOLS, run_script, script_env


def assert_trained(work_dir, world, out, iters=4):
    reports = probes(work_dir)
    assert sorted(reports) == list(range(world)), out[-5000:]
    assert {r["world_size"] for r in reports.values()} == {world}
    assert {r["iter"] for r in reports.values()} == {iters}
    assert f"iter_{iters}.pth" in checkpoints(work_dir)


@pytest.mark.e2e
@one_worker("eight_card_run")
def test_train_on_all_cards(eight_card_run):
    """No CARDS: the script counts the node's 8 (simulated) cards and starts 8 ranks."""
    out = eight_card_run["out"]
    assert eight_card_run["code"] == 0, out[-5000:]
    assert_trained(eight_card_run["work"], 8, out, eight_card_run["iters"])
    assert "mIoU" in out
    assert_quiet(out, 8)


def placed_ranks(log: str) -> set:
    """The ranks the placement summary lists ('    rank 1 on HOST: gcu:1 (card 1 of 8)')."""
    return {int(r) for r in re.findall(r"^\s+rank (\d+) on \S+: \S+ \(card ", log, re.M)}


def assert_quiet(out, world):
    """mmgcu's notices once, not once per rank; no warning that mmgcu causes."""
    assert out.count("torch_gcu is SIMULATED") == 1, out[-5000:]
    # The placement summary says what runs under mmengine's 'GPU number' header: one line per rank.
    assert re.search(r"mmgcu: gcu\d \(SIMULATED torch_gcu", out), out[-5000:]
    assert placed_ranks(out) == set(range(world)), out[-5000:]
    for noise in ("FutureWarning", "MKL_NUM_THREADS", "Setting OMP_NUM_THREADS"):
        assert noise not in out, noise


@pytest.fixture(scope="module")
def two_card_run(dataset, tmp_path_factory):
    """CARDS=2 of 8 (simulated) cards: a short training, shared with the test of dist_test.sh."""
    tmp = tmp_path_factory.mktemp("two_cards")
    # No validation: this run is for its ranks and checkpoint (dist_test.sh tests it).
    train_cfg = dict(type="IterBasedTrainLoop", max_iters=4, val_interval=100)
    cfg = write_config(tmp / "cfg.py", dataset, train_cfg=train_cfg)
    work = str(tmp / "work")
    code, out = run_script("dist_train.sh", cfg, 2, "--work-dir", work, cwd=tmp, MMGCU_SIMULATE=8)
    return dict(tmp=tmp, cfg=cfg, work=work, code=code, out=out)


@one_worker("two_card_run")
def test_train_on_two_cards(two_card_run):
    run = two_card_run
    assert run["code"] == 0, run["out"][-5000:]
    assert_trained(run["work"], 2, run["out"])


@one_worker("two_card_run")
def test_test_checkpoint_on_all_cards(two_card_run):
    """dist_test.sh without CARDS on a node of one card (cheap): GCURunner tests, mIoU printed."""
    run = two_card_run
    ckpt = os.path.join(run["work"], "iter_4.pth")
    assert os.path.exists(ckpt), run["out"][-5000:]
    work = str(run["tmp"] / "test")
    code, out = run_script(
        "dist_test.sh", run["cfg"], ckpt, "--work-dir", work, cwd=run["tmp"], MMGCU_SIMULATE=1
    )
    assert code == 0, out[-5000:]
    assert "Distributed launcher: pytorch" in out
    assert "mIoU" in out and "Iter(test)" in out
    # Loaded with torch's allow-list of an mmengine checkpoint's globals, not by turning
    # torch's check off for the process.
    assert "Load checkpoint from" in out and "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in out
    assert_quiet(out, 1)


def children(pid):
    """The pids of all processes below ``pid`` (from /proc, no psutil here)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found.update(kids)
        todo += kids
    return found


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def joined(work_dir, world):
    """Whether rank 0's log file (written line by line) shows the process group formed."""
    for log in glob.glob(os.path.join(str(work_dir), "*", "*.log")):
        with open(log) as f:
            if placed_ranks(f.read()) == set(range(world)):
                return True
    return False


def test_sigterm_stops_only_its_own_processes(dataset, tmp_path):
    """SIGTERM to the script stops its run, and leaves another 'python' process alone."""
    # Someone else's job on the node: its command line says python, as theirs did.
    bystander = subprocess.Popen(
        ["bash", "-c", 'exec -a "python bystander" sleep 60'], start_new_session=True
    )
    script = None
    try:
        deadline = time.time() + 10
        while b"python" not in cmdline(bystander.pid):
            assert time.time() < deadline, "the bystander did not start"
            time.sleep(0.1)
        # Long enough that it is still training when the signal comes.
        cfg = write_config(
            tmp_path / "cfg.py",
            dataset,
            train_cfg=dict(type="IterBasedTrainLoop", max_iters=100000, val_interval=100000),
        )
        log_path = tmp_path / "log.txt"
        with open(log_path, "w") as log:
            script = subprocess.Popen(
                [os.path.join(TOOLS, "dist_train.sh"), cfg, "2", "--work-dir", str(tmp_path)],
                env=script_env(MMGCU_SIMULATE=2),
                cwd=str(tmp_path),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # Signal once both workers have joined the group. Both worker processes existing
        # is not enough: torchrun registers them only after its start-up loop, and a
        # signal inside that loop leaves them unknown to it (and running).
        deadline = time.time() + 120
        while not joined(tmp_path, world=2):
            assert script.poll() is None, log_path.read_text()[-5000:]
            assert time.time() < deadline, log_path.read_text()[-5000:]
            time.sleep(0.2)
        ours = children(script.pid)
        assert sum(b"train.py" in cmdline(p) for p in ours) >= 2, ours

        script.send_signal(signal.SIGTERM)
        started = time.time()
        code = script.wait(timeout=30)
        elapsed = time.time() - started
        out = log_path.read_text()
        assert code != 0, out[-5000:]
        assert elapsed < 10, f"took {elapsed:.1f} s to stop"
        deadline = time.time() + 5
        while any(running(p) for p in ours) and time.time() < deadline:
            time.sleep(0.2)
        assert not [p for p in ours if running(p)], "workers outlived the script"
        assert bystander.poll() is None and running(bystander.pid), "killed someone else's job"
    finally:
        if script is not None and script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)  # only the group this test started
            script.wait()
        bystander.kill()
        bystander.wait()
