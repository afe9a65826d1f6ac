"""``mmgcu rehearse CONFIG``: the config on simulated cards, then a pre-flight report.

    mmgcu rehearse CONFIG [--cards 8] [--hardware t20|s60] [--iters 3 (small), 1 (real)]
                   [--scale small|real] [--card-memory 32] [--cfg-options k=v ...]

See :func:`mmgcu.rehearsal.run_rehearsal`; exit status 0 when every phase passed.
"""

import sys

from ..rehearsal.plan import (  # standard library only
    DEFAULT_HARDWARE,
    DEFAULT_ITERS,
    SMALL_SIDE,
    T20_MEMORY_GIB,
)


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "rehearse",
        help="rehearse a config on simulated cards and report what the T20 will do",
        description="Run CONFIG as a real job does (stock train.py under torchrun) on "
        "simulated cards, with synthetic data and no download: build, placement, wrap, "
        "training, validation, checkpoint, resume. Prints a report and writes it as "
        "rehearsal.json in the work dir.",
    )
    parser.add_argument("config", metavar="CONFIG", help="config file, or a shipped config")
    parser.add_argument(
        "--cards",
        type=int,
        default=8,
        help="cards of the job (default 8): as many simulated cards at --scale small; at "
        "--scale real one card is measured and the figure is each card's in a job of CARDS",
    )
    parser.add_argument(
        "--hardware",
        choices=("t20", "s60"),
        default=DEFAULT_HARDWARE,
        help="t20: torch_gcu 1.x (the default); s60: torch_gcu 2.x",
    )
    parser.add_argument(
        "--iters",
        type=int,
        default=None,
        help=f"training iterations (default {DEFAULT_ITERS['small']} at --scale small: on a "
        f"lazy card the first two compile; {DEFAULT_ITERS['real']} at --scale real: the "
        "later steps' memory is worked out from it)",
    )
    parser.add_argument(
        "--scale",
        choices=("small", "real"),
        default="small",
        help=f"small: crops shrunk to {SMALL_SIDE} px (seconds an iteration); real: the "
        "config's crop on one rank, for the memory of each card of the job (about one "
        "card's memory of this host)",
    )
    parser.add_argument(
        "--card-memory",
        type=float,
        default=T20_MEMORY_GIB,
        metavar="GIB",
        help=f"card memory the peaks are compared with (T20: {T20_MEMORY_GIB})",
    )
    parser.add_argument("--work-dir", help="default: work_dirs/<config>_rehearsal")
    parser.add_argument(
        "--cfg-options", nargs="+", default=[], metavar="KEY=VALUE", help="as train.py's"
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    from mmengine.config import DictAction

    from ..rehearsal import RehearsalError, format_report, run_rehearsal

    options = {}
    if args.cfg_options:
        import argparse

        namespace = argparse.Namespace()
        DictAction(option_strings=[], dest="options")(None, namespace, args.cfg_options)
        options = namespace.options
    try:
        report = run_rehearsal(
            args.config,
            cards=args.cards,
            hardware=args.hardware,
            iters=args.iters,
            scale=args.scale,
            card_memory_gib=args.card_memory,
            cfg_options=options,
            work_dir=args.work_dir,
            echo=lambda line: print(f"mmgcu rehearse: {line}", file=sys.stderr, flush=True),
        )
    except (RehearsalError, ValueError, KeyError) as e:  # or a config it cannot derive
        print(f"mmgcu rehearse: error: {e}", file=sys.stderr)
        return 1
    print(format_report(report))
    return 0 if report.passed else 1
