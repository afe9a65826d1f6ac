"""The torchrun command of a job on this node's cards, its workers' environment, and what
is refused before torchrun starts (each as one :class:`LaunchError` line that names the fix).

What ``mmgcu train``/``test`` (:mod:`mmgcu.cli.launch`), ``tools/dist_*.sh`` and the
rehearsal's jobs (:mod:`mmgcu.rehearsal.jobs`) run: ``python -m torch.distributed.run
--nproc_per_node=CARDS`` with mmseg's own ``tools/train.py`` (train) or
:mod:`mmgcu.cli.test_entry` (test: mmseg 1.2.2's test.py ignores ``runner_type``), and
``--launcher pytorch``.

Environment, as OpenMMLab's dist_train.sh: ``NNODES``, ``NODE_RANK``, ``MASTER_ADDR``,
``PORT`` (several nodes: the same command on each node with its NODE_RANK); ``TRAIN_SCRIPT``
and ``TEST_SCRIPT`` replace the scripts run.
"""

import importlib.util
import os
import os.path as osp
import sys
from typing import Dict, List, Optional, Tuple

from . import cards, configs, ports, preflight

#: The checkout (or site-packages) folder that holds the mmgcu package.
PACKAGE_PARENT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TEST_MODULE = "mmgcu.cli.test_entry"
ACTIVATE = (
    "run it with the python of the environment mmgcu is installed in: "
    "'source .venv/bin/activate' after 'make install', the vendor's environment on a T20, "
    "or PYTHON=/path/to/env/bin/python for tools/dist_*.sh"
)
#: What makes a job one of several nodes (OpenMMLab's dist_train.sh variables).
MULTI_NODE_VARS = ("NNODES", "NODE_RANK", "MASTER_ADDR", "PORT")
#: How often (s) torchrun's agent looks at its workers: torch 2's default. torch 1.10's is
#: 5 s, so there a job whose workers have all ended returns up to 5 s later (2.5 s on
#: average), and the peers of a failed rank are stopped as late.
MONITOR_INTERVAL = 0.1


class LaunchError(Exception):
    """What is wrong with the launch, as one line that names the fix."""


def split_cards(args: List[str]) -> Tuple[Optional[int], List[str]]:
    """An integer first argument is CARDS; anything else already belongs to the script."""
    if args and args[0].isdigit():
        return int(args[0], 10), args[1:]
    return None, args


def resolve_config(path: str) -> str:
    """``path`` if it is a file, else the shipped config it names."""
    if osp.isfile(path):
        return path
    found = configs.find_config(path)
    if found is None:
        raise LaunchError(
            f"config not found: {path} (not a file, nor a config shipped with mmgcu: "
            "'mmgcu configs' lists those)"
        )
    return found


def check_python(modules=("torch", "mmengine", "mmseg")) -> None:
    """Stop with the fix when this interpreter cannot import what the workers need."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise LaunchError(
            f"this python ({sys.executable}) cannot import {', '.join(missing)}: {ACTIVATE}"
        )


def train_script(env: Dict[str, str]) -> List[str]:
    """What torchrun runs for training: TRAIN_SCRIPT, else mmseg's own tools/train.py."""
    script = env.get("TRAIN_SCRIPT")
    if not script:
        spec = importlib.util.find_spec("mmseg")
        if spec is None or spec.origin is None:
            raise LaunchError(f"mmseg is not importable by {sys.executable}: {ACTIVATE}")
        script = osp.join(osp.dirname(spec.origin), ".mim", "tools", "train.py")
    if not osp.isfile(script):
        raise LaunchError(f"training script not found: {script} (set TRAIN_SCRIPT)")
    return [script]


def test_script(env: Dict[str, str]) -> List[str]:
    """What torchrun runs for testing: TEST_SCRIPT, else ``-m mmgcu.cli.test_entry``."""
    script = env.get("TEST_SCRIPT")
    if not script:
        return ["-m", TEST_MODULE]
    if not osp.isfile(script):
        raise LaunchError(f"test script not found: {script} (set TEST_SCRIPT)")
    return [script]


def resolve_cards(count: Optional[int], prog: str) -> Tuple[int, str]:
    """CARDS (``count``), or every card of this node (counted without touching one), and
    the source.

    More processes than counted cards is refused here: every rank would start, import
    torch and mmseg, and then refuse the same launch (tens of seconds, once per rank).
    """
    try:
        found, source = cards.count_cards()
    except ValueError as e:  # an MMGCU_SIMULATE that names no hardware
        raise LaunchError(str(e)) from None
    if count is not None:
        if count < 1:
            raise LaunchError(f"CARDS must be at least 1, got {count}")
        if 0 < found < count:
            raise LaunchError(
                f"{count} processes, one per card, but this node has {found} card(s) "
                f"({source}): run {prog} CONFIG {found} (or fewer), or make more cards "
                f"visible with {cards.VISIBLE_ENV}"
            )
        return count, "given"
    if found < 1:
        raise LaunchError(
            "found no GCU card on this node (TOPS_VISIBLE_DEVICES is unset, no simulator, "
            "and efsmi is missing or lists no card). Check the driver with 'efsmi', or give "
            f"the number of cards: {prog} CONFIG CARDS ...; without a card, rehearse on "
            f"simulated T20 cards: {cards.SIMULATE_ENV}=t20 {prog} CONFIG"
        )
    return found, source


def torch_version() -> Optional[str]:
    """This environment's torch version, from its metadata (torch is not imported here)."""
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # no metadata (a vendor build): take torch 1.x's path, safe on both
        return None


def _one_node(torch: Optional[str]) -> List[str]:
    """A rendezvous of this job's own on one node.

    torch 2's ``--standalone`` takes a free port, but torch 1.x's always uses
    localhost:29400, where a second job on other cards of the node would join the first
    one's store and die with it ("failed to send a keep-alive heartbeat to the
    rendezvous"). There the launcher picks a free port for a static rendezvous, whose store
    this launcher hosts. Not torch 1.10's c10d rendezvous: its launcher can hang after the
    workers have ended, or fail with "MemoryError: std::bad_alloc", in the store's
    compare_set as it closes the rendezvous.
    """
    if torch and not torch.startswith("1."):
        return ["--standalone"]
    return [
        "--nnodes=1",
        "--node_rank=0",
        "--master_addr=127.0.0.1",
        f"--master_port={ports.free_port()}",
    ]


def rendezvous(env: Dict[str, str], torch: Optional[str] = None) -> List[str]:
    """torchrun's rendezvous flags from NNODES, NODE_RANK, MASTER_ADDR and PORT, for the
    torch version ``torch`` (None: unknown); one node without PORT gets a rendezvous of its
    own (:func:`_one_node`)."""
    nnodes, node_rank = env.get("NNODES", "1"), env.get("NODE_RANK", "0")
    if not nnodes.isdigit() or int(nnodes) < 1:
        raise LaunchError(f"NNODES must be a positive integer, got '{nnodes}'")
    if not node_rank.isdigit() or int(node_rank) >= int(nnodes):
        raise LaunchError(f"NODE_RANK must be in 0..{int(nnodes) - 1}, got '{node_rank}'")
    if int(nnodes) == 1 and not env.get("PORT"):
        return _one_node(torch)
    if int(nnodes) > 1 and not env.get("MASTER_ADDR"):
        raise LaunchError(
            f"NNODES={nnodes} needs MASTER_ADDR, the address of node 0 (and the same PORT "
            "on every node)"
        )
    port = env.get("PORT") or "29500"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchError(f"PORT must be a TCP port number, got '{port}'")
    if int(node_rank) == 0 and ports.port_in_use(int(port)):
        raise LaunchError(
            f"PORT={port} is in use on this host (another job's rendezvous?): choose a free "
            "PORT, or on one node leave PORT unset and the launcher takes a free port"
        )
    return [
        f"--nnodes={int(nnodes)}",
        f"--node_rank={int(node_rank)}",
        f"--master_addr={env.get('MASTER_ADDR') or '127.0.0.1'}",
        f"--master_port={port}",
    ]


def torchrun_flags(env: Dict[str, str], torch: Optional[str] = None) -> List[str]:
    """torchrun's flags for a job of this node: :func:`rendezvous`'s, and on torch 1.x
    (or an unknown torch) torch 2's :data:`MONITOR_INTERVAL`."""
    flags = rendezvous(env, torch)
    if not torch or torch.startswith("1."):
        flags.append(f"--monitor_interval={MONITOR_INTERVAL}")  # torch 1.10 has no dash form
    return flags


def alone(env: Dict[str, str]) -> Dict[str, str]:
    """``env`` for a job that runs on this node alone, whatever the shell says of a job of
    several nodes (:data:`MULTI_NODE_VARS`): it takes a rendezvous of its own and joins
    no other job's."""
    return {k: v for k, v in env.items() if k not in MULTI_NODE_VARS}


def worker_env(env: Dict[str, str]) -> Dict[str, str]:
    """The workers' environment: this checkout importable, one thread each.

    In a checkout (not an installed mmgcu) its root goes first on PYTHONPATH, so that
    ``custom_imports=['mmgcu']`` imports this mmgcu. OMP and MKL get the one thread per
    process that mmengine sets for every distributed run anyway (and torchrun for OMP),
    without the notice each of them prints (mmengine once per rank).
    """
    env = dict(env)
    if osp.isfile(osp.join(PACKAGE_PARENT, "setup.py")):
        rest = env.get("PYTHONPATH")
        env["PYTHONPATH"] = PACKAGE_PARENT + (os.pathsep + rest if rest else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", env["OMP_NUM_THREADS"])
    return env


def cfg_options_warning(args: List[str]) -> Optional[str]:
    """mmengine imports ``custom_imports`` only from the config file: say so when given
    with ``--cfg-options``, where it would be silently ignored."""
    if any(a.startswith("custom_imports") for a in args) and "--cfg-options" in args:
        return (
            "custom_imports given with --cfg-options is not imported: mmengine reads "
            "custom_imports only from the config file. Put it in the config (or inherit "
            f"{configs.BASE} from 'mmgcu configs')."
        )
    return None


def config_problem(mode: str, config: str, rest: List[str], env: Dict[str, str]):
    """Why the config cannot run on the cards (:mod:`mmgcu.launch.preflight`), or None.
    Checked when the script is the stock one: a TRAIN_SCRIPT or TEST_SCRIPT of the user's
    may choose its runner itself."""
    if env.get("TRAIN_SCRIPT" if mode == "train" else "TEST_SCRIPT"):
        return None
    return preflight.config_problem(resolve_config(config), split_cards(rest)[1])


def plan(mode: str, config: str, rest: List[str], env: Dict[str, str], prog: str, checkpoint=None):
    """The torchrun command line, its environment and a one-line summary of the launch."""
    count, script_args = split_cards(rest)
    config = resolve_config(config)
    head = [config]
    if mode == "test":
        # mmengine also loads checkpoints from URLs.
        if not (osp.isfile(checkpoint) or "://" in checkpoint):
            raise LaunchError(f"checkpoint not found: {checkpoint}")
        head.append(checkpoint)
    check_python()
    target = train_script(env) if mode == "train" else test_script(env)
    nproc, source = resolve_cards(count, prog)
    command = [sys.executable, "-m", "torch.distributed.run", *torchrun_flags(env, torch_version())]
    command += [f"--nproc_per_node={nproc}", *target, *head, *script_args, "--launcher", "pytorch"]
    summary = f"{nproc} process(es), one per card ({source}), running {' '.join(target)}"
    return command, worker_env(env), summary
