"""``mmgcu train`` and ``mmgcu test``: one process per card of this node, under torchrun.

As ``mim train``/``mim test`` do for GPUs: count the node's cards, then replace this
process with the torchrun command of :mod:`mmgcu.launch.torchrun`. ``tools/dist_train.sh``
and ``tools/dist_test.sh`` are thin wrappers that run this file as a script.

    mmgcu train CONFIG [CARDS] [train.py args...]
    mmgcu test CONFIG CHECKPOINT [CARDS] [test.py args...]

Run as a script it imports the standard library and :mod:`mmgcu.launch` (loaded by its
path, without the mmgcu package) only, so the shell wrappers start it in milliseconds and
it can say in one line what is missing (torch, mmseg) instead of a traceback.
"""

import argparse
import importlib.util
import os
import os.path as osp
import sys
from typing import List, Optional

HERE = osp.dirname(osp.abspath(__file__))
#: The name :mod:`mmgcu.launch` takes when this file runs as a script.
SCRIPT_PACKAGE = "_mmgcu_launch"


EPILOG = """environment:
  NNODES, NODE_RANK, MASTER_ADDR, PORT  several nodes: the same command on each node with
                                        its NODE_RANK; MASTER_ADDR is node 0's address
  TRAIN_SCRIPT, TEST_SCRIPT             the script to run instead of mmseg's train.py /
                                        mmgcu's test entry
  MMGCU_SIMULATE=t20                    rehearse on 8 simulated T20 cards (no GCU needed;
                                        t20:4 for 4, s60:8 for torch_gcu 2.x)"""


def load_launch_package():
    """:mod:`mmgcu.launch` loaded from its folder beside this file's, under
    :data:`SCRIPT_PACKAGE`: its modules import only each other, relatively."""
    folder = osp.join(osp.dirname(HERE), "launch")
    spec = importlib.util.spec_from_file_location(
        SCRIPT_PACKAGE, osp.join(folder, "__init__.py"), submodule_search_locations=[folder]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules[SCRIPT_PACKAGE] = package
    spec.loader.exec_module(package)
    return package


if __package__:
    from .. import sim as _sim
    from ..launch import torchrun
else:  # run as a script by tools/dist_*.sh: no mmgcu package, no torch
    torchrun = load_launch_package().torchrun
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


def run(args) -> int:
    """Replace this process with torchrun (so signals reach it), or say what is wrong."""
    prog = getattr(args, "prog_name", None) or f"mmgcu {args.mode}"
    warning = torchrun.cfg_options_warning(args.args)
    if warning:
        print(f"{prog}: warning: {warning}", file=sys.stderr)
    try:
        command, env, summary = torchrun.plan(
            args.mode,
            args.config,
            args.args,
            # The ranks do not repeat what this process said of simulated cards.
            dict(os.environ) if _sim is None else _sim.child_env(os.environ),
            prog,
            getattr(args, "checkpoint", None),
        )
        problem = torchrun.config_problem(args.mode, args.config, args.args, env)
        if problem:
            raise torchrun.LaunchError(problem)
    except torchrun.LaunchError as e:
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
            print(torchrun.train_script(dict(os.environ))[0])
            return 0
        except torchrun.LaunchError as e:
            print(f"{prog or 'mmgcu train'}: error: {e}", file=sys.stderr)
            return 1
    parser = argparse.ArgumentParser(prog="mmgcu")
    add_parsers(parser.add_subparsers(dest="command", required=True), prog)
    args = parser.parse_args(argv)
    args.prog_name = prog or f"mmgcu {args.command}"
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
