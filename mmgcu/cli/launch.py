"""``mmgcu train`` and ``mmgcu test``: one process per card of this node, under torchrun.

As ``mim train``/``mim test`` do for GPUs: count the node's cards, then replace this
process with ``python -m torch.distributed.run --nproc_per_node=CARDS`` running mmseg's own
``tools/train.py`` (train) or :mod:`mmgcu.cli.test_entry` (test: mmseg 1.2.2's test.py
ignores ``runner_type``), with ``--launcher pytorch``. ``tools/dist_train.sh`` and
``tools/dist_test.sh`` are thin wrappers that run this file as a script.

    mmgcu train CONFIG [CARDS] [train.py args...]
    mmgcu test CONFIG CHECKPOINT [CARDS] [test.py args...]

Environment, as OpenMMLab's dist_train.sh: ``NNODES``, ``NODE_RANK``, ``MASTER_ADDR``,
``PORT`` (several nodes: the same command on each node with its NODE_RANK); ``TRAIN_SCRIPT``
and ``TEST_SCRIPT`` replace the scripts run.

Standard library only, so the shell wrappers start it in milliseconds and it can say in
one line what is missing (torch, mmseg) instead of a traceback.
"""

import argparse
import importlib.util
import os
import os.path as osp
import socket
import sys
from typing import Dict, List, Optional, Tuple

HERE = osp.dirname(osp.abspath(__file__))
PACKAGE_PARENT = osp.dirname(osp.dirname(HERE))
TEST_MODULE = "mmgcu.cli.test_entry"
ACTIVATE = (
    "run it with the python of the environment mmgcu is installed in: "
    "'source .venv/bin/activate' after 'make install', the vendor's environment on a T20, "
    "or PYTHON=/path/to/env/bin/python for tools/dist_*.sh"
)


EPILOG = """environment:
  NNODES, NODE_RANK, MASTER_ADDR, PORT  several nodes: the same command on each node with
                                        its NODE_RANK; MASTER_ADDR is node 0's address
  TRAIN_SCRIPT, TEST_SCRIPT             the script to run instead of mmseg's train.py /
                                        mmgcu's test entry
  MMGCU_SIMULATE=t20                    rehearse on 8 simulated T20 cards (no GCU needed;
                                        t20:4 for 4, s60:8 for torch_gcu 2.x)"""


class LaunchError(Exception):
    """What is wrong with the launch, as one line that names the fix."""


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __package__:
    from .. import sim as _sim
    from ..device import cards as _cards
    from ..device import ports as _ports
    from . import configs as _configs
    from . import preflight as _preflight
else:  # run as a script by tools/dist_*.sh: no mmgcu package, no torch
    _cards = _load("_mmgcu_cards", osp.join(HERE, "..", "device", "cards.py"))
    _ports = _load("_mmgcu_ports", osp.join(HERE, "..", "device", "ports.py"))
    _configs = _load("_mmgcu_configs", osp.join(HERE, "configs.py"))
    _preflight = _load("_mmgcu_preflight", osp.join(HERE, "preflight.py"))
    _sim = None  # nor a simulator that said anything


def add_parsers(sub, prog: Optional[str] = None) -> None:
    """The ``train`` and ``test`` subcommands (``prog`` names a wrapper script instead)."""
    for name, heads in (("train", "CONFIG"), ("test", "CONFIG CHECKPOINT")):
        tool = "train.py" if name == "train" else "test.py"
        parser = sub.add_parser(
            name,
            prog=prog,
            usage=f"%(prog)s {heads} [CARDS] [{tool} args...]",
            help=f"{name} on every card of this node (torchrun, {tool})",
            description=f"Run {tool} with --launcher pytorch on every card of this node "
            "(or CARDS of them), one process per card, under torchrun.",
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.add_argument("config", metavar="CONFIG", help="config file, or a shipped config")
        if name == "test":
            parser.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint to test")
        parser.add_argument(
            "args", nargs=argparse.REMAINDER, metavar="...", help=f"[CARDS] and {tool} args"
        )
        parser.set_defaults(func=run, mode=name)


def split_cards(args: List[str]) -> Tuple[Optional[int], List[str]]:
    """An integer first argument is CARDS; anything else already belongs to the script."""
    if args and args[0].isdigit():
        return int(args[0], 10), args[1:]
    return None, args


def resolve_config(path: str) -> str:
    """``path`` if it is a file, else the shipped config it names."""
    if osp.isfile(path):
        return path
    found = _configs.find_config(path)
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


def resolve_cards(cards: Optional[int], prog: str) -> Tuple[int, str]:
    """CARDS, or every card of this node (counted without touching one), and the source.

    More processes than counted cards is refused here: every rank would start, import
    torch and mmseg, and then refuse the same launch (tens of seconds, once per rank).
    """
    try:
        count, source = _cards.count_cards()
    except ValueError as e:  # an MMGCU_SIMULATE that names no hardware
        raise LaunchError(str(e)) from None
    if cards is not None:
        if cards < 1:
            raise LaunchError(f"CARDS must be at least 1, got {cards}")
        if 0 < count < cards:
            raise LaunchError(
                f"{cards} processes, one per card, but this node has {count} card(s) "
                f"({source}): run {prog} CONFIG {count} (or fewer), or make more cards "
                f"visible with {_cards.VISIBLE_ENV}"
            )
        return cards, "given"
    if count < 1:
        raise LaunchError(
            "found no GCU card on this node (TOPS_VISIBLE_DEVICES is unset, no simulator, "
            "and efsmi is missing or lists no card). Check the driver with 'efsmi', or give "
            f"the number of cards: {prog} CONFIG CARDS ...; without a card, rehearse on "
            f"simulated T20 cards: {_cards.SIMULATE_ENV}=t20 {prog} CONFIG"
        )
    return count, source


def torch_version() -> Optional[str]:
    """This environment's torch version, from its metadata (torch is not imported here)."""
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # no metadata (a vendor build): take torch 1.x's path, safe on both
        return None


def port_in_use(port: int) -> bool:
    """Whether a TCP port of this host has a listener (another job's store). A job that
    just ended (its connections in TIME_WAIT) does not count: the store reuses the address."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


def rendezvous(env: Dict[str, str], torch: Optional[str] = None) -> List[str]:
    """torchrun's rendezvous flags from NNODES, NODE_RANK, MASTER_ADDR and PORT, for the
    torch version ``torch`` (None: unknown).

    One node without PORT gets a rendezvous of its own. torch 2's ``--standalone`` takes a
    free port, but torch 1.x's always uses localhost:29400, so a second job on other cards
    of the node joined the first one's store and died with it ("failed to send a
    keep-alive heartbeat to the rendezvous"). There the launcher picks a free port for a
    static rendezvous, whose store this launcher hosts. Not torch 1.10's c10d rendezvous:
    its launcher can hang after the workers have ended, or fail with "MemoryError:
    std::bad_alloc", in the store's compare_set as it closes the rendezvous.
    """
    nnodes, node_rank = env.get("NNODES", "1"), env.get("NODE_RANK", "0")
    if not nnodes.isdigit() or int(nnodes) < 1:
        raise LaunchError(f"NNODES must be a positive integer, got '{nnodes}'")
    if not node_rank.isdigit() or int(node_rank) >= int(nnodes):
        raise LaunchError(f"NODE_RANK must be in 0..{int(nnodes) - 1}, got '{node_rank}'")
    if int(nnodes) == 1 and not env.get("PORT"):
        if torch and not torch.startswith("1."):
            return ["--standalone"]
        return [
            "--nnodes=1",
            "--node_rank=0",
            "--master_addr=127.0.0.1",
            f"--master_port={_ports.free_port()}",
        ]
    if int(nnodes) > 1 and not env.get("MASTER_ADDR"):
        raise LaunchError(
            f"NNODES={nnodes} needs MASTER_ADDR, the address of node 0 (and the same PORT "
            "on every node)"
        )
    port = env.get("PORT") or "29500"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchError(f"PORT must be a TCP port number, got '{port}'")
    if int(node_rank) == 0 and port_in_use(int(port)):
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


#: How often (s) torchrun's agent looks at its workers: torch 2's default. torch 1.10's is
#: 5 s, so there a job whose workers had all ended returned up to 5 s later (2.5 s on
#: average), and the peers of a failed rank were stopped as late.
MONITOR_INTERVAL = 0.1


def torchrun_flags(env: Dict[str, str], torch: Optional[str] = None) -> List[str]:
    """torchrun's flags for a job of this node: :func:`rendezvous`'s, and on torch 1.x
    (or an unknown torch) torch 2's :data:`MONITOR_INTERVAL`."""
    flags = rendezvous(env, torch)
    if not torch or torch.startswith("1."):
        flags.append(f"--monitor_interval={MONITOR_INTERVAL}")  # torch 1.10 has no dash form
    return flags


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
            f"{_configs.BASE} from 'mmgcu configs')."
        )
    return None


def config_problem(mode: str, config: str, rest: List[str], env: Dict[str, str]):
    """Why the config cannot run on the cards (:mod:`mmgcu.cli.preflight`), or None.
    Checked when the script is the stock one: a TRAIN_SCRIPT or TEST_SCRIPT of the user's
    may choose its runner itself."""
    if env.get("TRAIN_SCRIPT" if mode == "train" else "TEST_SCRIPT"):
        return None
    return _preflight.config_problem(resolve_config(config), split_cards(rest)[1])


def plan(mode: str, config: str, rest: List[str], env: Dict[str, str], prog: str, checkpoint=None):
    """The torchrun command line, its environment and a one-line summary of the launch."""
    cards, script_args = split_cards(rest)
    config = resolve_config(config)
    head = [config]
    if mode == "test":
        # mmengine also loads checkpoints from URLs.
        if not (osp.isfile(checkpoint) or "://" in checkpoint):
            raise LaunchError(f"checkpoint not found: {checkpoint}")
        head.append(checkpoint)
    check_python()
    target = train_script(env) if mode == "train" else test_script(env)
    nproc, source = resolve_cards(cards, prog)
    command = [sys.executable, "-m", "torch.distributed.run", *torchrun_flags(env, torch_version())]
    command += [f"--nproc_per_node={nproc}", *target, *head, *script_args, "--launcher", "pytorch"]
    summary = f"{nproc} process(es), one per card ({source}), running {' '.join(target)}"
    return command, worker_env(env), summary


def run(args) -> int:
    """Replace this process with torchrun (so signals reach it), or say what is wrong."""
    prog = getattr(args, "prog_name", None) or f"mmgcu {args.mode}"
    warning = cfg_options_warning(args.args)
    if warning:
        print(f"{prog}: warning: {warning}", file=sys.stderr)
    try:
        command, env, summary = plan(
            args.mode,
            args.config,
            args.args,
            # The ranks do not repeat what this process said of simulated cards.
            dict(os.environ) if _sim is None else _sim.child_env(os.environ),
            prog,
            getattr(args, "checkpoint", None),
        )
        problem = config_problem(args.mode, args.config, args.args, env)
        if problem:
            raise LaunchError(problem)
    except LaunchError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    print(f"{prog}: {summary}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # torchrun stops exactly the workers it started on Ctrl-C or SIGTERM; nothing is
    # killed by name.
    os.execve(sys.executable, command, env)
    return 1  # not reached


def main(argv: Optional[List[str]] = None) -> int:
    """``python mmgcu/cli/launch.py [--prog NAME] {train,test} ...`` (the shell wrappers).

    ``--train-script`` prints the training script ``mmgcu train`` would run (for
    tools/slurm_train.sh, which starts it with srun).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = None
    if argv[:1] == ["--prog"] and len(argv) > 1:
        prog, argv = argv[1], argv[2:]
    if argv == ["--train-script"]:
        try:
            print(train_script(dict(os.environ))[0])
            return 0
        except LaunchError as e:
            print(f"{prog or 'mmgcu train'}: error: {e}", file=sys.stderr)
            return 1
    parser = argparse.ArgumentParser(prog="mmgcu")
    add_parsers(parser.add_subparsers(dest="command", required=True), prog)
    args = parser.parse_args(argv)
    args.prog_name = prog or f"mmgcu {args.command}"
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
