"""The torchrun command of a job on this node's cards (what ``mmgcu train``/``test`` and the
rehearsal run), and what is refused before torchrun starts."""

import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from mmgcu.launch import torchrun
from mmgcu.launch.configs import config_root
from tests.conftest import REPO, TORCH_1
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
        return torchrun.plan(mode, str(cfg), list(args), env, f"mmgcu {mode}", checkpoint)

    return SimpleNamespace(cfg=str(cfg), ckpt=str(ckpt), plan=plan)


def parts(command):
    """torchrun's flags of a command, and the rest of it from ``--nproc_per_node`` on."""
    assert command[:3] == TORCHRUN
    at = next(i for i, a in enumerate(command) if a.startswith("--nproc_per_node="))
    return command[3:at], command[at:]


#: What torchrun gets after its rendezvous flags on this torch (:data:`MONITOR_INTERVAL`).
MONITOR = [f"--monitor_interval={torchrun.MONITOR_INTERVAL}"] if TORCH_1 else []


def test_train_defaults_to_all_cards_and_forwards_args(node):
    command, env, summary = node.plan("train", "--work-dir", "w d", "--cfg-options", "a=1")
    flags, rest = parts(command)
    if TORCH_1:  # a static rendezvous of the job's own on a free port
        assert flags[:3] == ["--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1"]
        assert flags[4:] == MONITOR
        assert flags[3].startswith("--master_port=")
    else:  # one node without PORT: torchrun takes a free port itself
        assert flags == ["--standalone"]
    assert rest == [
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
    flags, rest = parts(command)
    rendezvous = ["--nnodes=2", "--node_rank=1", "--master_addr=10.1.2.3", "--master_port=29555"]
    assert flags == rendezvous + MONITOR
    assert rest == ["--nproc_per_node=4"] + target + head + ["--work-dir", "w"] + [
        "--launcher",
        "pytorch",
    ]


def test_one_node_with_port_and_own_scripts(node, tmp_path):
    own = tmp_path / "my_train.py"
    own.write_text("")
    flags, rest = parts(node.plan("train", "2", PORT="29600", TRAIN_SCRIPT=str(own))[0])
    rendezvous = ["--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1", "--master_port=29600"]
    assert flags == rendezvous + MONITOR
    assert rest[:2] == ["--nproc_per_node=2", str(own)]
    _, rest = parts(node.plan("test", TEST_SCRIPT=str(own))[0])
    assert rest[1:3] == [str(own), node.cfg]


def test_one_node_on_torch_1_gets_a_rendezvous_of_its_own():
    """torch 1.x's --standalone is always localhost:29400, which a second job would join."""
    first, second = torchrun.rendezvous({}, "1.10.2"), torchrun.rendezvous({}, "1.10.2")

    for flags in (first, second):
        assert "--standalone" not in flags
        # a static rendezvous (torch 1.10's c10d one can hang as it closes)
        assert not any(f.startswith("--rdzv") for f in flags)
        assert flags[:3] == ["--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1"]
    ports = [f[3] for f in (first, second)]
    assert all(p.startswith("--master_port=") for p in ports)
    assert "--master_port=29400" not in ports and ports[0] != ports[1]
    # torch 2.x's --standalone takes a free port itself; an unknown torch is treated as 1.x.
    assert torchrun.rendezvous({}, "2.13.0") == ["--standalone"]
    assert torchrun.rendezvous({}, None)[0:2] == ["--nnodes=1", "--node_rank=0"]


def test_torchrun_on_torch_1_looks_at_its_workers_as_often_as_torch_2():
    """torch 1.10's agent looks every 5 s by default: a job returns up to 5 s after its
    workers end. This torch's torchrun reads the flag (every T20-leg job passes it), and
    torch 2 looks that often by default."""
    from torch.distributed.run import get_args_parser

    flags = torchrun.torchrun_flags({}, "1.10.2")
    assert flags[:3] == ["--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1"]
    parsed = get_args_parser().parse_args([*flags, "--nproc_per_node=2", "train.py"])
    assert parsed.monitor_interval == torchrun.MONITOR_INTERVAL
    if not TORCH_1:
        torch_2 = get_args_parser().parse_args(["train.py"])
        assert torch_2.monitor_interval == torchrun.MONITOR_INTERVAL
    assert torchrun.torchrun_flags({}, "2.13.0") == ["--standalone"]


def test_a_port_another_job_listens_on_is_refused():
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(torchrun.LaunchError, match=f"PORT={port} is in use on this host"):
            torchrun.rendezvous({"PORT": str(port)}, "1.10.2")
    # Only node 0 hosts the store: another node's launcher does not check the port.
    env = dict(NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.1", PORT=str(port))
    assert f"--master_port={port}" in torchrun.rendezvous(env, "1.10.2")


def test_shipped_config_by_name(node):
    command, _, _ = torchrun.plan(
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
    with pytest.raises(torchrun.LaunchError, match=message):
        node.plan(mode, *args, **env)


@pytest.mark.parametrize("mode", ["train", "test"])
def test_more_processes_than_cards_are_refused_by_the_launcher(node, mode):
    with pytest.raises(torchrun.LaunchError) as refused:
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
    with pytest.raises(torchrun.LaunchError, match="MMGCU_SIMULATE='t21': give a card count"):
        node.plan("train")


def test_missing_files_and_modules_are_refused(node, monkeypatch):
    with pytest.raises(torchrun.LaunchError, match="config not found: nope.py .*mmgcu configs"):
        torchrun.plan("train", "nope.py", [], {}, "mmgcu train")
    with pytest.raises(torchrun.LaunchError, match="checkpoint not found: nope.pth"):
        torchrun.plan("test", node.cfg, [], {}, "mmgcu test", "nope.pth")
    monkeypatch.setenv("MMGCU_SIMULATE", "0")
    with pytest.raises(torchrun.LaunchError, match="found no GCU card on this node.*=t20 mmgcu"):
        node.plan("train")
    real = torchrun.importlib.util.find_spec
    monkeypatch.setattr(
        torchrun.importlib.util, "find_spec", lambda n: None if n == "mmseg" else real(n)
    )
    with pytest.raises(torchrun.LaunchError, match="cannot import mmseg: .*source .venv/bin"):
        node.plan("train")


def test_custom_imports_in_cfg_options_is_named():
    assert torchrun.cfg_options_warning(["--cfg-options", "custom_imports.imports=[mmgcu]"])
    assert torchrun.cfg_options_warning(["--cfg-options", "a=1"]) is None


def test_a_job_alone_takes_a_rendezvous_of_its_own_whatever_the_shell_says():
    """A shell set up for a job of two nodes, whose node 0 holds PORT: a job of this node
    alone neither joins that rendezvous nor refuses the port."""
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        shell = dict(NNODES="2", NODE_RANK="0", MASTER_ADDR="10.0.0.1", PORT=port, HOME="/h")
        with pytest.raises(torchrun.LaunchError, match=f"PORT={port} is in use"):
            torchrun.torchrun_flags(shell, "1.10.2")
        env = torchrun.alone(shell)
        flags = torchrun.torchrun_flags(env, "1.10.2")
    assert env == {"HOME": "/h"}
    assert flags[:3] == ["--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1"]
    assert flags[3] != f"--master_port={port}"
    assert torchrun.torchrun_flags(env, "2.13.0") == ["--standalone"]


def test_the_launcher_run_as_a_script_loads_the_launch_package_alone():
    """tools/dist_*.sh run mmgcu/cli/launch.py as a script: it loads :mod:`mmgcu.launch` by
    its path, and neither the mmgcu package nor torch nor mmengine."""
    code = (
        "import runpy, sys; runpy.run_path(sys.argv[1], run_name='launcher'); "
        "print(' '.join(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('mmgcu', 'torch', 'mmengine', '_mmgcu_launch'))))"
    )
    script = os.path.join(REPO, "mmgcu", "cli", "launch.py")
    out = subprocess.run(
        [sys.executable, "-c", code, script], capture_output=True, text=True, check=True
    ).stdout.split()
    names = ("cards", "configs", "ports", "preflight", "torchrun")
    assert out == ["_mmgcu_launch"] + [f"_mmgcu_launch.{n}" for n in names]
