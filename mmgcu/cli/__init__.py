"""The ``mmgcu`` command: ``mmgcu env`` reports a machine, ``mmgcu check`` proves it trains.

Modelled on ``accelerate env`` / ``accelerate test``. The subcommand modules import only
the standard library at the top, so building the parser stays cheap; torch, mmengine and
the device layer are imported when a subcommand runs.
"""

import argparse
from typing import List, Optional

from ..version import __version__

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``mmgcu`` parser with its ``env`` and ``check`` subcommands."""
    from . import check, env

    parser = argparse.ArgumentParser(
        prog="mmgcu",
        description="Report and check an Enflame GCU machine for OpenMMLab training.",
    )
    parser.add_argument("--version", action="version", version=f"mmgcu {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{env,check}")
    env.add_parser(sub)
    check.add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``mmgcu`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.func(args) or 0)
