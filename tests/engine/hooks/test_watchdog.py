"""The watchdog's configuration, and the one-message stop of every rank."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from mmgcu.device import GCUError
from mmgcu.engine.hooks.watchdog import GCUWatchdogHook, NoWatchdog, build_watchdog
from mmgcu.runtime import heartbeat as hb
from mmgcu.runtime.excepthook import stop_every_rank


def watchdog_of(distributed=True, **env_cfg):
    """What build_watchdog makes of ``env_cfg`` for a run with or without several ranks."""
    return build_watchdog(env_cfg, distributed)


def test_one_process_or_false_has_no_watchdog():
    assert isinstance(watchdog_of(distributed=False), NoWatchdog)
    assert isinstance(watchdog_of(watchdog=False), NoWatchdog)
    with NoWatchdog().saving():
        pass
    NoWatchdog().stand_down()  # what FaultGuard calls whichever it holds


def test_defaults_half_nccls_ten_minutes_and_thirty_for_slow_phases():
    dog = watchdog_of()
    assert isinstance(dog, GCUWatchdogHook)
    assert (dog.timeout, dog.slow_timeout, dog.interval) == (300.0, 1800.0, 2.0)


def test_the_collective_timeout_is_the_default_bound():
    dog = watchdog_of(dist_cfg=dict(timeout=60))
    assert (dog.timeout, dog.slow_timeout) == (60.0, 1800.0)
    dog = watchdog_of(dist_cfg=dict(timeout=60), watchdog=dict(timeout=20))
    assert dog.timeout == 20.0


def test_an_unknown_key_is_refused():
    with pytest.raises(GCUError, match=r"unknown key\(s\) \['timout'\]"):
        watchdog_of(watchdog=dict(timout=5))


def test_rank_0_reports_and_the_others_wait_for_the_launcher():
    with pytest.raises(GCUError, match="^the checkpoint is damaged$"):
        stop_every_rank("the checkpoint is damaged", rank=0, world_size=8, grace_s=5)
    started = time.time()
    with pytest.raises(GCUError, match="^rank 3 stops: rank 0 says why$"):
        stop_every_rank("the checkpoint is damaged", rank=3, world_size=8, grace_s=0.2)
    assert time.time() - started >= 0.2


# -- what the watchdog does, driven through its hook with peers' beats in its folder ---


class Logger:
    def __init__(self):
        self.errors = []

    def error(self, message):
        self.errors.append(message)


def start(tmp_path, rank, it):
    """A watchdog of ``rank`` at iteration ``it``, checking every 0.1 s, bound 0.5 s."""
    fake = SimpleNamespace(iter=it, rank=rank, work_dir=str(tmp_path), timestamp="run", card=rank)
    fake.logger = Logger()
    dog = GCUWatchdogHook(timeout=0.5, interval=0.1, slow_timeout=60)
    dog.silent_after = 0.3
    dog.before_train(fake)
    fake.iter = it + 1  # it has trained since the start: steady training
    return dog, fake


def peer(dog, rank, it, pid, seq=1, host=None, ppid=None):
    hb.write_beat(
        dog.folder,
        dict(rank=rank, host=host or socket.gethostname(), pid=pid, ppid=ppid or os.getppid(),
             card=rank, phase="train", iter=it, start=0, step=0, saves=0, seq=seq, where=""),
    )  # fmt: skip


@pytest.fixture
def exits(monkeypatch):
    """os._exit recorded instead of done (the watchdog ends its own process with it)."""
    codes = []
    monkeypatch.setattr(os, "_exit", codes.append)
    return codes


def test_a_stopped_neighbour_is_killed_and_named(tmp_path, exits):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        dog, fake = start(tmp_path, rank=0, it=10)
        peer(dog, 1, 10, child.pid)  # its beat never changes again
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        dog.after_train(fake)
        if child.poll() is None:
            child.kill()
    (message,) = fake.logger.errors
    assert f"the job is stuck on rank 1 (host {socket.gethostname()}, pid {child.pid}" in message
    assert "state T: SIGSTOP" in message and "rank 0 kills it (SIGKILL)" in message
    assert exits == []  # the killer itself goes on; the launcher ends the job


def test_a_rank_behind_the_others_exits_by_itself(tmp_path, exits):
    dog, fake = start(tmp_path, rank=1, it=10)
    stop, beats = threading.Event(), []

    def healthy_peers():  # ranks 0 and 2, alive (their beats change), one iteration ahead
        seq = 0
        while not stop.wait(0.05):
            seq += 1
            for rank in (0, 2):
                peer(dog, rank, 12, pid=1, seq=seq, host="elsewhere")
            beats.append(seq)

    feeder = threading.Thread(target=healthy_peers)
    feeder.start()
    try:
        deadline = time.time() + 10
        while not exits and time.time() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        feeder.join()
        dog.after_train(fake)
    assert exits == [1]
    (message,) = fake.logger.errors
    assert "the job is stuck on rank 1" in message and "ranks 0, 2 wait in a train step" in message
    assert "its process runs but its main thread has not moved" in message


def test_a_rank_that_stood_down_gives_no_verdict(tmp_path, exits):
    """A rank waiting for the launcher after a peer's failure (FaultGuard) is no hang: its
    watchdog says nothing, however long the launcher takes; it goes on beating as it was
    (a change of its beat would restart the other ranks' clocks)."""
    dog, fake = start(tmp_path, rank=1, it=10)
    dog.stand_down()
    for seq in range(1, 21):  # ranks 0 and 2, alive and ahead, for four times the bound
        for rank in (0, 2):
            peer(dog, rank, 12, pid=1, seq=seq, host="elsewhere")
        time.sleep(0.1)
    beat = hb.read_beats(dog.folder)[1]
    dog.after_train(fake)
    assert exits == [] and fake.logger.errors == []
    assert (beat["phase"], beat["iter"]) == ("train", 11) and beat["seq"] > 5
