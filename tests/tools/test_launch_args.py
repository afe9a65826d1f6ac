"""What the launch scripts run: stand-ins for python and srun record the command lines."""

import json
import os
import re
import sys

import pytest

from tests.conftest import REPO
from tests.e2e.conftest import mmseg_tool
from tests.tools.conftest import TOOLS, run_script, write_exe

# mmseg 1.2.2's test.py ignores runner_type, so dist_test.sh runs mmgcu's tools/test.py.
OWN_TEST = os.path.join(REPO, "tools", "test.py")

# Stands in for PYTHON: answers the card count with FAKE_CARDS, runs `-c` code with the real
# interpreter (so the scripts find mmseg's tools), and records every call.
FAKE_PYTHON = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps(dict(argv=args, pythonpath=os.environ.get("PYTHONPATH", ""))) + "\\n")
if args[:1] and args[0].endswith("mmgcu/device/cards.py"):
    print(os.environ["FAKE_CARDS"])
elif args[:1] == ["-c"]:
    os.execv(sys.executable, [sys.executable] + args)
else:
    sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
"""

# Stands in for srun: records its arguments and the environment the tasks would get.
FAKE_SRUN = """#!{python}
import json, os, sys
env = {{k: os.environ.get(k) for k in ("PYTHONPATH", "MASTER_PORT")}}
with open(os.environ["FAKE_RECORD"], "w") as f:
    json.dump(dict(argv=sys.argv[1:], env=env), f)
"""

PY = sys.executable


@pytest.fixture
def fake(tmp_path):
    """Run a script with the fake python; return (exit code, output, launches, calls)."""
    python = write_exe(tmp_path / "fake-python", FAKE_PYTHON.format(python=PY))
    record = tmp_path / "record.jsonl"
    cfg = tmp_path / "cfg.py"
    cfg.write_text("# a config\n")
    ckpt = tmp_path / "iter_4.pth"
    ckpt.write_text("")

    def run(script, *args, cards=8, **env):
        if record.exists():
            record.unlink()
        code, out = run_script(
            script,
            *args,
            cwd=tmp_path,
            timeout=60,
            PYTHON=python,
            FAKE_RECORD=record,
            FAKE_CARDS=cards,
            **env,
        )
        lines = record.read_text().splitlines() if record.exists() else []
        calls = [json.loads(line) for line in lines]
        launches = [c for c in calls if c["argv"][:2] == ["-m", "torch.distributed.run"]]
        return code, out, launches, calls

    run.cfg, run.ckpt = str(cfg), str(ckpt)
    return run


def counted(calls):
    return any(c["argv"][:1] and c["argv"][0].endswith("mmgcu/device/cards.py") for c in calls)


def test_train_defaults_to_all_cards_and_forwards_args(fake):
    code, out, launches, calls = fake(
        "dist_train.sh", fake.cfg, "--work-dir", "w d", "--cfg-options", "a=1", "b=2", cards=8
    )
    assert code == 0, out
    assert counted(calls)
    [launch] = launches
    # One node without PORT: torchrun's standalone rendezvous takes a free port.
    assert launch["argv"] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=8",
        mmseg_tool("train.py"),
        fake.cfg,
        "--work-dir",
        "w d",
        "--cfg-options",
        "a=1",
        "b=2",
        "--launcher",
        "pytorch",
    ]
    assert launch["pythonpath"].split(os.pathsep)[0] == REPO


@pytest.mark.parametrize("script", ["dist_train.sh", "dist_test.sh"])
def test_cards_argument_and_several_nodes(fake, script):
    head = [fake.cfg] if script == "dist_train.sh" else [fake.cfg, fake.ckpt]
    env = dict(NNODES=2, NODE_RANK=1, MASTER_ADDR="10.1.2.3", PORT=29555)
    code, out, launches, calls = fake(script, *head, 4, "--work-dir", "w", **env)
    assert code == 0, out
    assert not counted(calls), "CARDS was given, nothing to count"
    tool = mmseg_tool("train.py") if script == "dist_train.sh" else OWN_TEST
    [launch] = launches
    argv = launch["argv"]
    assert "--standalone" not in argv
    flags = ["--nnodes=2", "--node_rank=1", "--master_addr=10.1.2.3", "--master_port=29555"]
    assert set(flags) < set(argv[: argv.index(tool)])
    assert "--nproc_per_node=4" in argv
    assert argv[argv.index(tool) :] == [tool, *head, "--work-dir", "w", "--launcher", "pytorch"]


def test_one_node_with_port(fake):
    code, out, [launch], _ = fake("dist_train.sh", fake.cfg, "2", PORT=29600)
    assert code == 0, out
    argv = launch["argv"]
    for flag in ["--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1", "--master_port=29600"]:
        assert flag in argv
    assert "--standalone" not in argv and "--nproc_per_node=2" in argv


def test_script_override_and_exit_status(fake, tmp_path):
    own = tmp_path / "my_train.py"
    own.write_text("")
    code, out, [launch], _ = fake("dist_train.sh", fake.cfg, TRAIN_SCRIPT=own, FAKE_EXIT=3)
    assert code == 3, "torchrun's exit status is the script's"
    assert str(own) in launch["argv"] and mmseg_tool("train.py") not in launch["argv"]


def test_test_script_counts_cards(fake):
    code, out, [launch], calls = fake("dist_test.sh", fake.cfg, fake.ckpt, "--out", "o", cards=3)
    assert code == 0, out
    assert counted(calls)
    assert launch["argv"][2:] == [
        "--standalone",
        "--nproc_per_node=3",
        OWN_TEST,
        fake.cfg,
        fake.ckpt,
        "--out",
        "o",
        "--launcher",
        "pytorch",
    ]


@pytest.mark.parametrize(
    "script,args,env,message",
    [
        ("dist_train.sh", [], {}, "usage: dist_train.sh CONFIG [CARDS]"),
        ("dist_train.sh", ["--work-dir", "w"], {}, "usage:"),
        ("dist_train.sh", ["missing.py"], {}, "config not found: missing.py"),
        ("dist_train.sh", ["CFG", "0"], {}, "CARDS must be at least 1"),
        ("dist_train.sh", ["CFG"], {"cards": 0}, "found no GCU card on this node"),
        ("dist_train.sh", ["CFG"], {"NNODES": 2}, "NNODES=2 needs MASTER_ADDR"),
        ("dist_train.sh", ["CFG"], {"NNODES": 2, "NODE_RANK": 2}, "NODE_RANK must be in 0..1"),
        ("dist_test.sh", ["CFG"], {}, "usage: dist_test.sh CONFIG CHECKPOINT"),
        ("dist_test.sh", ["CFG", "nope.pth"], {}, "checkpoint not found: nope.pth"),
    ],
)
def test_wrong_use_fails_with_a_message(fake, script, args, env, message):
    args = [fake.cfg if a == "CFG" else a for a in args]
    code, out, launches, _ = fake(script, *args, **env)
    assert code != 0 and not launches
    assert message in out


def test_no_card_with_the_real_count(tmp_path):
    """No TOPS_VISIBLE_DEVICES, no simulator, and an efsmi that lists no card."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_exe(bin_dir / "efsmi", "#!/bin/sh\necho 'DEV  Name  | FW |'\n")
    cfg = tmp_path / "cfg.py"
    cfg.write_text("")
    code, out = run_script(
        "dist_train.sh", cfg, cwd=tmp_path, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    )
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
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_exe(bin_dir / "srun", FAKE_SRUN.format(python=PY))
    record = tmp_path / "srun.json"
    cfg = tmp_path / "cfg.py"
    cfg.write_text("")

    def run(*args, **env):
        if record.exists():
            record.unlink()
        path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
        code, out = run_script(
            "slurm_train.sh", *args, cwd=tmp_path, timeout=60, PATH=path, FAKE_RECORD=record, **env
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
