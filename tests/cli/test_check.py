"""``mmgcu check`` with real torchrun processes on simulated cards: passes and failures."""

import argparse
import json
import os
import re
import time

import pytest

from mmgcu.cli import check
from mmgcu.cli.check import _laggards
from tests.cli.conftest import mmgcu

PREFIX = "mmgcu check: "


def ok_line(proc):
    """The one line a passing check prints."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX + "OK: "), proc.stdout
    diff = float(re.search(r"max diff ([-+.e\d]+)\)", lines[0]).group(1))
    assert diff <= 1e-5, lines[0]
    return lines[0]


def failure(proc):
    """The one ``mmgcu check: FAILED`` line of a failing check."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = [x for x in proc.stderr.splitlines() if x.startswith(PREFIX)]
    assert len(lines) == 1 and lines[0].startswith(PREFIX + "FAILED: "), proc.stderr
    return lines[0]


def left_dirs(tmp_path):
    return sorted(tmp_path.glob("mmgcu-check-*"))


GCU1_GROUPS = "torch.distributed gloo_eccl + torch_gcu.distributed eccl"


@pytest.mark.parametrize(
    "simulate,api,group", [("s60:8", "gcu2", "cpu:gloo,gcu:eccl"), ("t20", "gcu1", GCU1_GROUPS)]
)
def test_two_cards_pass(simulate, api, group, tmp_path):
    proc = mmgcu("check", "--cards", "2", MMGCU_SIMULATE=simulate, TMPDIR=tmp_path)
    line = ok_line(proc)
    assert line.startswith(f"{PREFIX}OK: 2 ranks on 2 simulated GCU cards ({api}, {group}); ")
    assert "collectives and 3 DDP steps match one card" in line
    assert left_dirs(tmp_path) == []  # the results folder goes when the check passes


@pytest.mark.e2e
def test_default_checks_every_card():
    # 3 cards: neither the T20's 8 nor the 2 of the other checks, so a fixed default fails.
    line = ok_line(mmgcu("check", MMGCU_SIMULATE=3, timeout=300))
    assert line.startswith(f"{PREFIX}OK: 3 ranks on 3 simulated GCU cards (gcu2, ")


def test_more_ranks_than_cards_fails_before_launching(tmp_path):
    started = time.time()
    line = failure(mmgcu("check", "--cards", "9", MMGCU_SIMULATE=8, TMPDIR=tmp_path))
    assert "--cards 9 but this node has 8 card(s)" in line and "--cards 8 or fewer" in line
    assert left_dirs(tmp_path) == [] and time.time() - started < 30


def test_no_cards_without_gcu_points_at_the_simulator(tmp_path):
    line = failure(mmgcu("check"))
    assert "no GCU card found" in line and "MMGCU_SIMULATE=t20 mmgcu check" in line
    line = failure(mmgcu("check", "--cards", "2", TMPDIR=tmp_path))
    assert "--cards 2, but this machine has no torch_gcu and no GCU card" in line
    assert "MMGCU_SIMULATE=t20 mmgcu check --cards 2" in line
    assert left_dirs(tmp_path) == []  # refused before any worker started


def test_mmgcu_error_passes_through(tmp_path):
    """A GCUError from mmgcu's set-up reaches the user as it is: it names the fix."""
    proc = mmgcu("check", "--cards", "2", MMGCU_SIMULATE=8, MMGCU_SIMULATE_ECCL=0, TMPDIR=tmp_path)
    line = failure(proc)
    assert "(init): ECCL is not available: torch_gcu is imported but" in line
    assert "Install the ECCL package of your TopsRider release" in line


def test_wrong_collective_names_op_and_rank(tmp_path):
    line = failure(
        mmgcu("check", "--cards", "2", MMGCU_SIMULATE=8, TMPDIR=tmp_path, fault="all_reduce")
    )
    assert "(collectives): all_reduce(sum) on gcu cards gave wrong values on rank(s) 1 of 2" in line
    assert "rank 1 got [4.0, 4.0, 4.0, 4.0], expected 3.0" in line
    (kept,) = left_dirs(tmp_path)  # kept for the logs the line points to
    assert f"(logs: {kept})" in line
    assert {p.name for p in kept.iterdir()} >= {"launcher.log", "rank0.json", "rank1.json"}


def test_timeout_names_the_silent_rank_and_stops_the_run(tmp_path):
    proc = mmgcu(
        "check", "--cards", "2", "--timeout", "20", MMGCU_SIMULATE=8, TMPDIR=tmp_path, fault="hang"
    )
    line = failure(proc)
    assert "timed out after 20 s: rank 1 (card 1) never reported" in line
    assert re.search(r"while rank\(s\) 0 reached '(start|init)'", line), line  # 'start' if slow
    (kept,) = left_dirs(tmp_path)
    with open(kept / "rank0.json") as f:
        rank0 = json.load(f)
    assert not os.path.exists(f"/proc/{rank0['pid']}")
    # Nothing of this run is left: every process named its results folder on its command line.
    for cmdline in _cmdlines():
        assert str(kept).encode() not in cmdline


def test_rank_that_dies_without_a_result(tmp_path):
    line = failure(mmgcu("check", "--cards", "2", MMGCU_SIMULATE=8, TMPDIR=tmp_path, fault="exit"))
    assert "torchrun exited with status 1 before every rank finished" in line
    # Rank 1 may die before rank 0 reports anything; torchrun's summary still names it.
    assert "torchrun saw rank 1 fail first (exit code 3)" in line


def _cmdlines():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                yield f.read()
        except OSError:
            continue


def test_laggards_when_every_rank_waits_in_one_collective():
    said = _laggards({0: {"phase": "ddp"}, 1: {"phase": "ddp"}}, 2)
    assert said.startswith("all 2 ranks stopped in 'ddp', so a collective never completed")


def test_each_check_on_torch_1_has_a_rendezvous_of_its_own():
    """Two checks at once on the T20 stack: torch 1.x's --standalone would put both on
    localhost:29400, where the second joins the first."""
    args = argparse.Namespace(steps=3, device="gcu", timeout=60)
    first, second = (check.command(args, 2, "out", "1.10.2") for _ in range(2))
    for cmd in (first, second):
        assert "--standalone" not in cmd and "--nnodes=1" in cmd
    ports = [next(f for f in cmd if f.startswith("--master_port=")) for cmd in (first, second)]
    assert ports[0] != ports[1]
    assert "--standalone" in check.command(args, 2, "out", "2.13.0")
