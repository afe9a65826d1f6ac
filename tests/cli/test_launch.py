"""``mmgcu train`` / ``mmgcu test`` as a user runs them: a wrong launch refused in one line
before torchrun starts, and one real launch of a stand-in script on two ranks (the command
they build: tests/launch/test_torchrun.py)."""

import glob
import json
import os
import subprocess
import sys

from mmgcu.cli import launch
from tests.cli.conftest import PROGRAMS, mmgcu


def test_a_wrong_launch_stops_before_torchrun_in_one_line(tmp_path):
    """12 ranks on 8 cards, and a stock mmseg config (no runner_type): each is one line
    (after the simulator's notice), and torchrun never starts (it would print its own)."""
    stock = tmp_path / "stock.py"
    stock.write_text('_base_ = ["mmseg::_base_/default_runtime.py"]\n')
    gcu = tmp_path / "gcu.py"
    gcu.write_text(
        '_base_ = ["mmseg::_base_/default_runtime.py"]\n'
        "custom_imports = dict(imports=['mmgcu'])\nrunner_type = 'GCURunner'\n"
    )
    for args, expected in (
        ((gcu, "12"), "mmgcu train: error: 12 processes, one per card, but this node has 8"),
        ((stock,), f"mmgcu train: error: {stock} would run on mmengine's own Runner"),
        ((stock, "--cfg-options", "runner_type=GCURunner"), "imports nothing"),
    ):
        proc = mmgcu("train", *args, MMGCU_SIMULATE="t20", timeout=60)
        assert proc.returncode == 1, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        (line,) = [line for line in lines if not line.startswith("mmgcu: torch_gcu is SIMULATED")]
        assert line.startswith("mmgcu train: error: ") and expected in line, line


def test_real_launch_of_two_ranks(tmp_path, monkeypatch):
    """The console entry execs torchrun, which starts the script once per card, with one
    intra-op thread per rank where the user's shell sets none (torchrun's default, without
    its warning)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the test session sets one
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    script = os.path.join(PROGRAMS, "record_rank.py")
    cfg = tmp_path / "cfg.py"
    cfg.write_text("")
    env = dict(MMGCU_SIMULATE=8, TRAIN_SCRIPT=script, RECORD_DIR=tmp_path)
    proc = mmgcu("train", cfg, "2", "--work-dir", "w", timeout=120, **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mmgcu train: 2 process(es), one per card (given)" in proc.stderr
    ranks = sorted(glob.glob(str(tmp_path / "rank*.json")))
    assert [os.path.basename(r) for r in ranks] == ["rank0.json", "rank1.json"]
    for path in ranks:
        with open(path) as f:
            seen = json.load(f)
        assert seen["argv"] == [str(cfg), "--work-dir", "w", "--launcher", "pytorch"]
        assert seen["env"]["WORLD_SIZE"] == "2"
        assert (seen["env"]["OMP_NUM_THREADS"], seen["env"]["MKL_NUM_THREADS"]) == ("1", "1")
    assert "Setting OMP_NUM_THREADS" not in proc.stdout + proc.stderr
    failed = mmgcu("train", cfg, "2", timeout=120, RECORD_EXIT=3, **env)
    assert failed.returncode != 0, "a failed rank fails the launch"


def test_custom_imports_warning_is_printed(tmp_path):
    cfg = tmp_path / "cfg.py"
    cfg.write_text("")
    proc = subprocess.run(
        [sys.executable, launch.__file__, "train", str(cfg), "--cfg-options", "custom_imports=x"],
        capture_output=True,
        text=True,
        env=dict(os.environ, MMGCU_SIMULATE="0"),
    )
    assert "mmgcu train: warning: custom_imports given with --cfg-options" in proc.stderr
