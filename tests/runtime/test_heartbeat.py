"""Heartbeat files, and the rules that name the rank a stalled job waits for."""

import os
import signal
import subprocess
import sys
import time

import pytest

from mmgcu.runtime import heartbeat as hb


def beat(rank, phase="train", it=10, **extra):
    """A heartbeat as a rank in steady training publishes it."""
    found = dict(rank=rank, host="h", pid=100 + rank, ppid=1, card=rank, phase=phase, iter=it)
    found.update(start=0, step=0, saves=0, seq=1, where="")
    found.update(extra)
    return found


def test_beats_are_replaced_whole_and_unreadable_ones_skipped(tmp_path):
    hb.write_beat(str(tmp_path), beat(0))
    hb.write_beat(str(tmp_path), beat(1, it=11))
    hb.write_beat(str(tmp_path), beat(1, it=12))
    (tmp_path / "rank7.json").write_text('{"rank": 7, "ph')  # a foreign, torn file
    (tmp_path / ".rank2.json.partial").write_text("{}")
    beats = hb.read_beats(str(tmp_path))
    assert sorted(beats) == [0, 1] and beats[1]["iter"] == 12
    assert "rank1.json" in os.listdir(tmp_path) and ".rank1.json.partial" not in os.listdir(
        tmp_path
    )


def test_other_runs_heartbeats_are_removed(tmp_path):
    for run in ("old", "new"):
        (tmp_path / run).mkdir()
        hb.write_beat(str(tmp_path / run), beat(0))
    hb.remove_other_runs(str(tmp_path / "new"))
    assert os.listdir(tmp_path) == ["new"]


def test_ages_are_measured_on_the_readers_clock():
    seen = hb.Observer()
    seen.update({0: beat(0), 1: beat(1)}, now=100.0)
    seen.update({0: dict(beat(0, it=11), seq=2), 1: dict(beat(1), seq=2)}, now=103.0)
    seen.update({0: dict(beat(0, it=11), seq=2), 1: dict(beat(1), seq=2)}, now=110.0)
    assert seen.silence(1, 110.0) == 7.0  # its beat last changed at 103
    assert seen.stall(110.0) == 7.0  # rank 0 last moved at 103


def test_a_silent_rank_is_the_culprit():
    beats = {0: beat(0, it=11), 1: beat(1, it=10), 2: beat(2, it=11)}
    assert hb.diagnose(beats, silent=[1]) == hb.Verdict([1], "silent", False)


def test_a_silent_rank_waiting_for_rank_0s_save_is_the_culprit():
    beats = {0: beat(0, it=11), 1: beat(1, phase="wait", it=10), 2: beat(2, it=11)}
    assert hb.diagnose(beats, silent=[1]) == hb.Verdict([1], "silent", False)


def test_a_rank_behind_the_others_is_the_culprit():
    beats = {0: beat(0, it=11), 1: beat(1, it=10), 2: beat(2, it=11)}
    assert hb.diagnose(beats, silent=[]) == hb.Verdict([1], "behind", False)


def test_level_ranks_name_the_one_not_in_a_collective():
    waits = "torch/distributed/distributed_c10d.py:2500 all_reduce"
    beats = {r: beat(r, where=waits) for r in (0, 2, 3)}
    beats[1] = beat(1, where="mmseg/models/backbones/resnet.py:300 forward")
    assert hb.diagnose(beats, silent=[]) == hb.Verdict([1], "elsewhere", False)


def test_level_ranks_all_in_a_collective_name_no_one():
    waits = "torch/autograd/__init__.py:200 backward"
    beats = {r: beat(r, where=waits) for r in range(4)}
    assert hb.diagnose(beats, silent=[]) == hb.Verdict([], "unknown", False)


def test_rank_0_saving_while_the_others_wait_gets_the_slow_bound():
    beats = {0: beat(0, phase="save", where="torch/serialization.py:600 save")}
    beats.update({r: beat(r, phase="wait") for r in (1, 2)})
    assert hb.diagnose(beats, silent=[]) == hb.Verdict([0], "elsewhere", True)


def test_a_rank_in_its_first_iteration_gets_the_slow_bound():
    beats = {0: beat(0, phase="start", it=0), 1: beat(1, phase="start", it=0)}
    assert hb.diagnose(beats, silent=[1]).slow
    assert not hb.diagnose({0: beat(0), 1: beat(1)}, silent=[1]).slow


def test_validation_follows_its_iteration_and_precedes_the_next_step():
    order = [beat(0, "val", 10), beat(0, "evaluate", 10), beat(0, "train", 10), beat(0, "save", 10)]
    assert sorted(order, key=hb.progress) == order
    assert hb.describe(beat(0, "val", 10, step=3)) == "validation (after iteration 10, batch 4)"
    assert hb.describe(beat(0, "train", 10)) == "a train step (iteration 11)"


def test_process_state_tells_a_stopped_process():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        for _ in range(50):
            if hb.process_state(child.pid)[0] == "T":
                break
            time.sleep(0.05)
        assert hb.process_state(child.pid)[0] == "T"
    finally:
        child.kill()
        child.wait()
    assert hb.process_state(child.pid) is None
    assert isinstance(hb.process_state(os.getpid())[1], int)


@pytest.mark.parametrize(
    "where, waiting",
    [
        ("torch/distributed/distributed_c10d.py:1 all_reduce", True),
        ("mmgcu/sim/eccl.py:1 _run < torch/distributed/c10d:1 x", True),
        ("torch/_tensor.py:1 backward < torch/autograd/__init__.py:1 backward", True),
        ("torch/nn/modules/conv.py:1 forward", False),
        ("", False),
    ],
)
def test_in_collective(where, waiting):
    assert hb.in_collective(where) is waiting
