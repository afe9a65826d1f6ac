"""``mmgcu train`` / ``mmgcu test``: the torchrun command they build for a node, what they
refuse with one line, and one real launch of a stand-in script on two ranks."""

import glob
import json
import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from mmgcu.cli import launch
from mmgcu.cli.configs import config_root
from tests.cli.conftest import PROGRAMS, mmgcu
from tests.conftest import REPO
from tests.e2e.conftest import mmseg_tool

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A node of 8 simulated cards, a config and a checkpoint; ``node.plan(mode, ...)``."""
    for name in ("TOPS_VISIBLE_DEVICES", "MMGCU_SIMULATE", "TRAIN_SCRIPT", "TEST_SCRIPT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MMGCU_SIMULATE", "8")
    cfg, ckpt = tmp_path / "cfg.py", tmp_path / "iter_4.pth"
    cfg.write_text("# a config\n")
    ckpt.write_text("")

    def plan(mode, *args, **env):
        checkpoint = str(ckpt) if mode == "test" else None
        return launch.plan(mode, str(cfg), list(args), env, f"mmgcu {mode}", checkpoint)

    return SimpleNamespace(cfg=str(cfg), ckpt=str(ckpt), plan=plan)


def test_train_defaults_to_all_cards_and_forwards_args(node):
    command, env, summary = node.plan("train", "--work-dir", "w d", "--cfg-options", "a=1")
    assert command == TORCHRUN + [
        "--standalone",  # one node without PORT: torchrun takes a free port itself
        "--nproc_per_node=8",
        mmseg_tool("train.py"),
        node.cfg,
        "--work-dir",
        "w d",
        "--cfg-options",
        "a=1",
        "--launcher",
        "pytorch",
    ]
    assert env["PYTHONPATH"].split(os.pathsep)[0] == REPO  # this checkout, not installed
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("1", "1")
    assert summary.startswith("8 process(es), one per card (MMGCU_SIMULATE=8")


@pytest.mark.parametrize("mode", ["train", "test"])
def test_cards_argument_and_several_nodes(node, mode):
    env = dict(NNODES="2", NODE_RANK="1", MASTER_ADDR="10.1.2.3", PORT="29555")
    command, _, _ = node.plan(mode, "4", "--work-dir", "w", **env)
    target = [mmseg_tool("train.py")] if mode == "train" else ["-m", "mmgcu.cli.test_entry"]
    head = [node.cfg] if mode == "train" else [node.cfg, node.ckpt]
    at = command.index("--nproc_per_node=4") + 1
    flags = ["--nnodes=2", "--node_rank=1", "--master_addr=10.1.2.3", "--master_port=29555"]
    assert command[3:at] == flags + ["--nproc_per_node=4"]
    assert command[at:] == target + head + ["--work-dir", "w", "--launcher", "pytorch"]


def test_one_node_with_port_and_own_scripts(node, tmp_path):
    own = tmp_path / "my_train.py"
    own.write_text("")
    command, _, _ = node.plan("train", "2", PORT="29600", TRAIN_SCRIPT=str(own))
    assert command[3:8] == [
        "--nnodes=1",
        "--node_rank=0",
        "--master_addr=127.0.0.1",
        "--master_port=29600",
        "--nproc_per_node=2",
    ]
    assert command[8] == str(own)
    command, _, _ = node.plan("test", TEST_SCRIPT=str(own))
    assert command[5:7] == [str(own), node.cfg]


def test_one_node_on_torch_1_gets_a_rendezvous_of_its_own():
    """torch 1.x's --standalone is always localhost:29400, which a second job would join."""
    first, second = launch.rendezvous({}, "1.10.2"), launch.rendezvous({}, "1.10.2")

    for flags in (first, second):
        assert "--standalone" not in flags
        # a static rendezvous (torch 1.10's c10d one can hang as it closes)
        assert not any(f.startswith("--rdzv") for f in flags)
        assert flags[:3] == ["--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1"]
    ports = [f[3] for f in (first, second)]
    assert all(p.startswith("--master_port=") for p in ports)
    assert "--master_port=29400" not in ports and ports[0] != ports[1]
    # torch 2.x's --standalone takes a free port itself; an unknown torch is treated as 1.x.
    assert launch.rendezvous({}, "2.13.0") == ["--standalone"]
    assert launch.rendezvous({}, None)[0:2] == ["--nnodes=1", "--node_rank=0"]


def test_torchrun_on_torch_1_looks_at_its_workers_as_often_as_torch_2():
    """torch 1.10's agent looks every 5 s by default: a job returns up to 5 s after its
    workers end. torch 1.10 reads the flag as this torch does (every T20-leg job passes it)."""
    from torch.distributed.run import get_args_parser

    flags = launch.torchrun_flags({}, "1.10.2")
    assert flags[:3] == ["--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1"]
    parsed = get_args_parser().parse_args([*flags, "--nproc_per_node=2", "train.py"])
    torch_2 = get_args_parser().parse_args(["train.py"])  # this leg's torch 2.x
    assert parsed.monitor_interval == torch_2.monitor_interval == launch.MONITOR_INTERVAL
    assert launch.torchrun_flags({}, "2.13.0") == ["--standalone"]


def test_a_port_another_job_listens_on_is_refused():
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(launch.LaunchError, match=f"PORT={port} is in use on this host"):
            launch.rendezvous({"PORT": str(port)}, "1.10.2")
    # Only node 0 hosts the store: another node's launcher does not check the port.
    env = dict(NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.1", PORT=str(port))
    assert f"--master_port={port}" in launch.rendezvous(env, "1.10.2")


def test_shipped_config_by_name(node):
    command, _, _ = launch.plan(
        "train", "fcn_r18-tiny_8xgcu_synthetic-64x64", [], {}, "mmgcu train"
    )
    shipped = os.path.join(config_root(), "tiny", "fcn_r18-tiny_8xgcu_synthetic-64x64.py")
    assert command[command.index(mmseg_tool("train.py")) + 1] == shipped


@pytest.mark.parametrize(
    "mode,args,env,message",
    [
        ("train", ["0"], {}, "CARDS must be at least 1, got 0"),
        ("train", [], {"NNODES": "2"}, "NNODES=2 needs MASTER_ADDR"),
        ("train", [], {"NNODES": "2", "NODE_RANK": "2"}, "NODE_RANK must be in 0..1"),
        ("train", [], {"NNODES": "x"}, "NNODES must be a positive integer"),
        ("train", [], {"TRAIN_SCRIPT": "/nope.py"}, "training script not found: /nope.py"),
        ("test", [], {"TEST_SCRIPT": "/nope.py"}, "test script not found: /nope.py"),
        ("train", [], {"PORT": "29x"}, "PORT must be a TCP port number, got '29x'"),
    ],
)
def test_wrong_launch_is_refused(node, mode, args, env, message):
    with pytest.raises(launch.LaunchError, match=message):
        node.plan(mode, *args, **env)


@pytest.mark.parametrize("mode", ["train", "test"])
def test_more_processes_than_cards_are_refused_by_the_launcher(node, mode):
    with pytest.raises(launch.LaunchError) as refused:
        node.plan(mode, "12")
    message = str(refused.value)
    assert message.startswith("12 processes, one per card, but this node has 8 card(s)")
    assert f"run mmgcu {mode} CONFIG 8 (or fewer)" in message


@pytest.mark.parametrize("simulate,cards", [("t20", 8), ("t20:4", 4), ("s60:2", 2), ("3", 3)])
def test_simulated_hardware_counts_its_cards(node, monkeypatch, simulate, cards):
    monkeypatch.setenv("MMGCU_SIMULATE", simulate)
    command, _, summary = node.plan("train")
    assert f"--nproc_per_node={cards}" in command
    assert summary.startswith(f"{cards} process(es), one per card (MMGCU_SIMULATE={simulate}")


def test_unknown_simulated_hardware_is_refused(node, monkeypatch):
    monkeypatch.setenv("MMGCU_SIMULATE", "t21")
    with pytest.raises(launch.LaunchError, match="MMGCU_SIMULATE='t21': give a card count"):
        node.plan("train")


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


def test_missing_files_and_modules_are_refused(node, monkeypatch):
    with pytest.raises(launch.LaunchError, match="config not found: nope.py .*mmgcu configs"):
        launch.plan("train", "nope.py", [], {}, "mmgcu train")
    with pytest.raises(launch.LaunchError, match="checkpoint not found: nope.pth"):
        launch.plan("test", node.cfg, [], {}, "mmgcu test", "nope.pth")
    monkeypatch.setenv("MMGCU_SIMULATE", "0")
    with pytest.raises(launch.LaunchError, match="found no GCU card on this node.*=t20 mmgcu"):
        node.plan("train")
    real = launch.importlib.util.find_spec
    monkeypatch.setattr(
        launch.importlib.util, "find_spec", lambda n: None if n == "mmseg" else real(n)
    )
    with pytest.raises(launch.LaunchError, match="cannot import mmseg: .*source .venv/bin"):
        node.plan("train")


def test_custom_imports_in_cfg_options_is_named():
    assert launch.cfg_options_warning(["--cfg-options", "custom_imports.imports=[mmgcu]"])
    assert launch.cfg_options_warning(["--cfg-options", "a=1"]) is None


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
