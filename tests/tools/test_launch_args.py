"""What the launch scripts run: stand-ins for python, srun and efsmi record the command
lines (tests/tools/programs/). What `mmgcu train`/`mmgcu test` then launch is tested in
tests/cli/test_launch.py."""

import json
import os
import re
import shutil
import sys

import pytest

from tests.conftest import REPO
from tests.e2e.conftest import mmseg_tool
from tests.tools.conftest import PROGRAMS, TOOLS, run_script

LAUNCH = os.path.join(REPO, "mmgcu", "cli", "launch.py")
PY = sys.executable


def program(tmp_path, name, as_name=None):
    """tests/tools/programs/NAME in a bin folder of its own; returns (bin folder, path)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / (as_name or name)
    shutil.copy(os.path.join(PROGRAMS, name), path)
    return bin_dir, str(path)


def on_path(bin_dir):
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


@pytest.mark.parametrize("script,mode", [("dist_train.sh", "train"), ("dist_test.sh", "test")])
def test_wrappers_exec_mmgcu_launcher(tmp_path, script, mode):
    """The shell scripts are thin wrappers: every argument goes to `mmgcu train/test`."""
    _, python = program(tmp_path, "fake_python")
    record = tmp_path / "record.jsonl"
    args = ["cfg.py", "4", "--work-dir", "w d", "--cfg-options", "a=1"]
    code, out = run_script(
        script, *args, cwd=tmp_path, timeout=60, PYTHON=python, FAKE_RECORD=record, FAKE_EXIT=3
    )
    assert code == 3, "the launcher's exit status is the script's"
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert calls == [[LAUNCH, "--prog", script, mode, *args]]


def test_wrapper_without_python(tmp_path):
    code, out = run_script(
        "dist_train.sh", "cfg.py", cwd=tmp_path, timeout=60, PYTHON="no-such-python"
    )
    assert code == 1
    assert "dist_train.sh: error: PYTHON=no-such-python is not a command" in out
    assert "source .venv/bin/activate" in out


def test_wrapper_with_a_python_without_torch(tmp_path):
    """A python that is not mmgcu's environment: one line that says so, no traceback."""
    _, bare = program(tmp_path, "bare_python")
    cfg = tmp_path / "cfg.py"
    cfg.write_text("")
    for script, head in (("dist_train.sh", [cfg]), ("dist_test.sh", [cfg, cfg])):
        code, out = run_script(script, *head, cwd=tmp_path, timeout=60, PYTHON=bare, REAL_PYTHON=PY)
        assert code == 1, out
        assert f"{script}: error: this python" in out and "cannot import torch" in out
        assert "Traceback" not in out and "source .venv/bin/activate" in out


def test_wrapper_usage(tmp_path):
    code, out = run_script("dist_train.sh", cwd=tmp_path, timeout=60)
    assert code == 2 and "usage: dist_train.sh CONFIG [CARDS] [train.py args...]" in out
    code, out = run_script("dist_test.sh", "-h", cwd=tmp_path, timeout=60)
    assert code == 0 and "usage: dist_test.sh CONFIG CHECKPOINT [CARDS] [test.py args...]" in out


def test_no_card_with_the_real_count(tmp_path):
    """No TOPS_VISIBLE_DEVICES, no simulator, and an efsmi that lists no card."""
    bin_dir, _ = program(tmp_path, "efsmi")
    cfg = tmp_path / "cfg.py"
    cfg.write_text("")
    code, out = run_script("dist_train.sh", cfg, cwd=tmp_path, PATH=on_path(bin_dir))
    assert code == 1, out
    assert "dist_train.sh: error: found no GCU card on this node" in out
    assert "torch.distributed" not in out, "nothing was launched"


def test_no_process_is_killed_by_name():
    for name in ("dist_train.sh", "dist_test.sh", "slurm_train.sh"):
        with open(os.path.join(TOOLS, name)) as f:
            text = f.read()
        assert not re.search(r"pkill|killall", text), name
        assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
        assert os.access(os.path.join(TOOLS, name), os.X_OK), f"{name} is not executable"


@pytest.fixture
def srun(tmp_path):
    """Run tools/slurm_train.sh with a fake srun on PATH; return (code, output, call)."""
    bin_dir, _ = program(tmp_path, "fake_srun", "srun")
    record = tmp_path / "srun.json"
    cfg = tmp_path / "cfg.py"
    cfg.write_text("")

    def run(*args, **env):
        if record.exists():
            record.unlink()
        code, out = run_script(
            "slurm_train.sh",
            *args,
            cwd=tmp_path,
            timeout=60,
            PATH=on_path(bin_dir),
            FAKE_RECORD=record,
            **env,
        )
        call = json.loads(record.read_text()) if record.exists() else None
        return code, out, call

    run.cfg = str(cfg)
    return run


def test_slurm_defaults(srun):
    code, out, call = srun("gcu", "seg", srun.cfg, "work", "--cfg-options", "x=1")
    assert code == 0, out
    assert call["argv"] == [
        "-p",
        "gcu",
        "--job-name=seg",
        "--ntasks=8",
        "--ntasks-per-node=8",
        "--cpus-per-task=5",
        "--kill-on-bad-exit=1",
        PY,
        "-u",
        mmseg_tool("train.py"),
        srun.cfg,
        "--work-dir=work",
        "--cfg-options",
        "x=1",
        "--launcher",
        "slurm",
    ]
    assert call["env"]["PYTHONPATH"].split(os.pathsep)[0] == REPO
    assert call["env"]["MASTER_PORT"] is None


def test_slurm_two_nodes_and_options(srun):
    env = dict(
        CARDS=16,
        CARDS_PER_NODE=8,
        CPUS_PER_TASK=2,
        SRUN_ARGS="--quotatype=auto --exclusive",
        GRES="gcu:8",
        PORT=29700,
    )
    code, out, call = srun("p", "j", srun.cfg, "--resume", **env)
    assert code == 0, out
    argv = call["argv"]
    launched = argv.index(PY)
    for flag in ["--ntasks=16", "--ntasks-per-node=8", "--cpus-per-task=2", "--gres=gcu:8"]:
        assert flag in argv[:launched]
    assert argv[launched - 2 : launched] == ["--quotatype=auto", "--exclusive"]
    # No WORK_DIR: '--resume' already belongs to train.py.
    assert argv[launched + 3 :] == [srun.cfg, "--resume", "--launcher", "slurm"]
    assert call["env"]["MASTER_PORT"] == "29700"


def test_slurm_few_cards_and_wrong_use(srun):
    code, out, call = srun("p", "j", srun.cfg, CARDS=2)
    assert code == 0, out
    assert "--ntasks=2" in call["argv"] and "--ntasks-per-node=2" in call["argv"]
    code, out, call = srun("p", "j")
    assert code == 2 and call is None
    assert "usage: slurm_train.sh PARTITION JOB_NAME CONFIG [WORK_DIR]" in out
