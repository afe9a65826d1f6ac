"""Locks: a second holder is refused with the first's details; a dead holder leaves none."""

import json
import os
import stat
import subprocess
import sys

import pytest

from mmgcu.runtime import locks
from tests.conftest import REPO

PROGRAMS = os.path.join(REPO, "tests", "runtime", "programs")
HOLDER = os.path.join(PROGRAMS, "lock_holder.py")
SLOW_WRITER = os.path.join(PROGRAMS, "lock_slow_writer.py")


@pytest.fixture
def holder(tmp_path):
    """Another process that holds ``tmp_path/gcu0.lock`` until killed."""
    path = str(tmp_path / "gcu0.lock")
    proc = subprocess.Popen(
        [sys.executable, HOLDER, path],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=REPO),
    )
    assert json.loads(proc.stdout.readline()) is None  # it got the lock
    yield path, proc
    proc.kill()
    proc.wait()


def test_a_held_lock_is_refused_with_its_holder(holder):
    path, proc = holder
    fd, found = locks.try_lock(path, {"pid": os.getpid(), "job": "second"})
    assert fd is None and found == {"pid": proc.pid, "job": "first"}


def test_a_killed_holder_leaves_no_stale_lock(holder):
    path, proc = holder
    proc.kill()
    proc.wait()
    fd, found = locks.try_lock(path, {"pid": os.getpid(), "job": "second"})
    try:
        assert fd is not None and found is None
        assert locks.read_holder(path) == {"pid": os.getpid(), "job": "second"}
    finally:
        os.close(fd)


def test_a_holder_not_yet_written_is_not_taken_for_the_previous_one(tmp_path):
    """Between its flock and its write, the file still names the previous, ended holder."""
    path = tmp_path / "gcu0.lock"
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    path.write_text(json.dumps({"pid": int(ended.stdout), "job": "old"}))
    proc = subprocess.Popen(
        [sys.executable, SLOW_WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        fd, found = locks.try_lock(str(path), {"pid": os.getpid(), "job": "second"})
        assert fd is None and found == {"pid": proc.pid, "job": "new"}
    finally:
        proc.kill()
        proc.wait()


def test_the_card_lock_folder_is_shared_by_every_user(tmp_path, monkeypatch):
    folder = tmp_path / "locks"
    monkeypatch.setenv(locks.LOCK_DIR_ENV, str(folder))
    assert locks.lock_dir() == str(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o1777  # sticky, like /tmp


def test_the_job_is_its_rendezvous_address(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert locks.job_id() == "10.0.0.1:29500"
    monkeypatch.delenv("MASTER_PORT")
    assert locks.job_id().endswith(f":pid{os.getpid()}")


def test_the_refusal_names_the_other_job_and_the_fix():
    holder = dict(pid=42, rank=0, launcher_pid=40, host="n1", started="12:00", work_dir="/w")
    card = locks.refusal("card 3 of n1", holder)
    assert card.startswith(
        "card 3 of n1 is in use by another running job: pid 42 (rank 0, launcher pid 40) on "
        "n1, started 12:00, work dir /w. "
    )
    assert "give this one other cards (TOPS_VISIBLE_DEVICES" in card
    work = locks.refusal("the work dir /w", holder)
    assert "overwrite each other's checkpoints. Give this job its own --work-dir" in work
