"""The ``mmgcu`` command: report, check, train and test on the GCU cards of a node.

``mmgcu env`` reports a machine and ``mmgcu check`` proves it trains (modelled on
``accelerate env`` / ``accelerate test``); ``mmgcu train`` and ``mmgcu test`` run mmseg's
training and mmgcu's test entry on every card under torchrun (as ``mim train``/``mim test``
do); ``mmgcu configs`` says where the shipped configs are. The subcommand modules import
only the standard library at the top, so building the parser stays cheap; torch, mmengine
and the device layer are imported when a subcommand runs.
"""

import argparse
from typing import List, Optional

from ..version import __version__

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``mmgcu`` parser with its subcommands."""
    from . import check, configs, env, launch, rehearse

    parser = argparse.ArgumentParser(
        prog="mmgcu",
        description="Report, check, train and test on the Enflame GCU cards of this node.",
    )
    parser.add_argument("--version", action="version", version=f"mmgcu {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{env,check,train,test,rehearse,configs}")
    env.add_parser(sub)
    check.add_parser(sub)
    launch.add_parsers(sub)
    rehearse.add_parser(sub)
    configs.add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``mmgcu`` console script; returns the exit status."""
    from ..runtime import excepthook

    excepthook.install()  # a GCUError is printed alone
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.func(args) or 0)
