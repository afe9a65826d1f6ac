"""mmgcu performance benchmark (``make bench``): prints a table and writes it as JSON.

Sections (``--sections``, all by default; each is a module of ``sections/``, whose
docstring says what it measures and how):

1. ``overhead``: per-iteration time of ``GCURunner`` against stock ``Runner``, on the CPU and
   on one simulated card (target <= 1.01 each).
2. ``startup``: ``import mmgcu`` (without and with the simulator, cached and compiling) and
   launch to the first training iteration.
3. ``rehearsal``: the 8-rank simulated run of the tiny config for each API, fp32 and
   ``--amp`` (target < 60 s), and gcu1 against a baseline commit
   (``--rehearsal-baseline``, target <= 1.2x).
4. ``simcost``: a simulated card against the plain CPU: a training step, single ops.
5. ``host_reads``: card reads (host waits) and lazy graph runs per iteration of a stock mmseg
   FCN config on 2 simulated ranks after the first log interval, mmgcu against stock
   logging and with ``--amp`` in each overflow step (target: one per log line).
6. ``sync_bn``: one ``GCUSyncBatchNorm`` layer against torch's SyncBN algorithm and BN on 2
   and 4 gloo ranks (target <= 1.0 against torch's), and its collectives.
7. ``graphs``: what keeping the simulated T20 card's lazy graph costs the 8-rank run of
   section 3, against ``MMGCU_SIM_XLA=off`` (target <= 1.10x).
8. ``padding``: the metrics of make demo's model on validation images of 12 sizes, each
   at its own size and padded to mmgcu's shape buckets (information).

Layout: this file (command line, main), ``harness.py`` (processes, environments, datasets,
configs, the baseline checkout, timing helpers, the machine), ``sections/<name>.py``,
``report.py`` (table, JSON), ``rows.py`` (docs/performance.md's rows of each section) and
``performance.py`` (docs/performance.md from the runs kept in ``runs/``, which ``make bench``
adds this run to). Children are files: ``import_time.py``, ``simcost.py``, ``sync_bn.py``,
``host_reads_probe.py`` (a hook).

Every section takes minutes on a 2-core VM, the first compile of the simulator more;
``--quick`` is a smoke run. Run on a quiet machine: the 1-minute load average before and
after each section is recorded, and a busy start is flagged.

    python tools/benchmarks/bench.py [--quick] [--sections overhead,startup] [--out FILE]
"""

import argparse
import os.path as osp
import sys
import time

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))  # harness, sections, report

import harness  # noqa: E402
import report  # noqa: E402
import sections  # noqa: E402
from harness import api_name, load1, log, split_list  # noqa: E402

QUICK = dict(
    overhead_pairs=1,
    overhead_iters=12,
    overhead_warmup=3,
    overhead_sim_runs=1,
    overhead_sim_iters=8,
    import_repeats=1,
    launch_runs=1,
    rehearsal_baseline_pairs=1,
    simcost_steps=3,
    simcost_op_number=200,
    simcost_repeat=2,
    host_reads_iters=15,
    host_reads_interval=5,
    sync_bn_number=5,
    sync_bn_repeat=2,
    graphs_pairs=1,
)


def _general(p):
    p.add_argument("--out", default="bench_results/bench.json", help="JSON results file")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: smallest sizes (explicit sizes win)"
    )
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    p.add_argument("--sections", default=",".join(sections.NAMES), help="comma-separated subset")
    p.add_argument("--python", default=sys.executable, help="interpreter of the children")
    p.add_argument("--threads", type=int, default=1, help="OMP/MKL threads of every child")
    p.add_argument("--timeout", type=float, default=900, help="seconds per child process")
    p.add_argument("--workdir", help="scratch folder (None: a new temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the scratch folder (logs)")
    p.add_argument(
        "--ext-dir",
        help="TORCH_EXTENSIONS_DIR of the cached runs (None: the one the compile "
        "measurement fills, in the scratch folder)",
    )


def _overhead_and_startup(p):
    g = p.add_argument_group("1 overhead")
    g.add_argument("--overhead-pairs", type=int, default=12, help="A B pairs (processes x2)")
    g.add_argument("--overhead-iters", type=int, default=150, help="iterations per run")
    g.add_argument(
        "--overhead-apart",
        action="store_true",
        help="run a pair's A and B one after the other (default: at the same time, where "
        "there is a CPU for each)",
    )
    g.add_argument("--overhead-warmup", type=int, default=5, help="first iterations dropped")
    g.add_argument("--overhead-size", type=int, default=128, help="synthetic image side")
    g.add_argument(
        "--overhead-sim-runs",
        type=int,
        default=12,
        help="simulated-card A B pairs (0: none)",
    )
    g.add_argument("--overhead-sim-iters", type=int, default=150, help="their iterations")
    g = p.add_argument_group("2 start-up")
    g.add_argument("--import-repeats", type=int, default=5, help="fresh interpreters per variant")
    g.add_argument("--launch-runs", type=int, default=3, help="tools/train.py runs per variant")
    g.add_argument("--launch-iters", type=int, default=2, help="iterations of those runs")
    g.add_argument("--skip-compile", action="store_true", help="do not time a fresh compile")


def _rehearsal_and_simcost(p):
    g = p.add_argument_group("3 rehearsal")
    g.add_argument("--rehearsal-apis", default="gcu2,gcu1", help="simulated APIs to rehearse")
    g.add_argument("--rehearsal-api", help="one API only (the same as --rehearsal-apis API)")
    g.add_argument("--rehearsal-runs", type=int, default=1, help="fp32 runs per API (median)")
    g.add_argument("--rehearsal-amp-runs", type=int, default=1, help="--amp runs per API (0: none)")
    g.add_argument(
        "--rehearsal-baseline",
        default="14e0974",
        help="baseline commit whose torch_gcu 1.x rehearsal gcu1's is compared with ('': none)",
    )
    g.add_argument("--rehearsal-baseline-pairs", type=int, default=3, help="baseline/tree pairs")
    g = p.add_argument_group("4 simcost")
    g.add_argument("--simcost-apis", default="gcu2,gcu1", help="simulated APIs to measure")
    g.add_argument("--simcost-steps", type=int, default=30, help="timed train steps per device")
    g.add_argument("--simcost-op-number", type=int, default=2000, help="op calls per timing")
    g.add_argument("--simcost-repeat", type=int, default=5, help="timings per op (median)")


def _host_reads_and_sync_bn(p):
    g = p.add_argument_group("5 host reads")
    g.add_argument("--host-reads-apis", default="gcu2,gcu1", help="simulated APIs to count")
    g.add_argument("--host-reads-iters", type=int, default=30, help="training iterations")
    g.add_argument("--host-reads-interval", type=int, default=10, help="logger interval")
    g = p.add_argument_group("6 SyncBN")
    g.add_argument("--sync-bn-ranks", default="2,4", help="gloo ranks, one run each")
    g.add_argument("--sync-bn-number", type=int, default=20, help="calls per timing")
    g.add_argument("--sync-bn-repeat", type=int, default=5, help="timings per variant (median)")
    g = p.add_argument_group("7 graphs")
    g.add_argument("--graphs-pairs", type=int, default=3, help="off / kept pairs of runs")


def _normalise(p, args):
    if args.quick:
        defaults = {a.dest: a.default for a in p._actions}
        for key, value in QUICK.items():
            if getattr(args, key) == defaults[key]:  # explicit sizes win over --quick
                setattr(args, key, value)
    args.sections = split_list(args.sections)
    unknown = sorted(set(args.sections) - set(sections.NAMES))
    if unknown:
        p.error(f"unknown section(s) {unknown}; choose from {', '.join(sections.NAMES)}")
    if args.rehearsal_api:
        args.rehearsal_apis = args.rehearsal_api
    for key in ("rehearsal_apis", "simcost_apis", "host_reads_apis"):
        apis = [api_name(a) for a in split_list(getattr(args, key))]
        bad = sorted(set(apis) - {"gcu2", "gcu1"})
        if bad:
            p.error(f"--{key.replace('_', '-')}: unknown API(s) {bad}; use gcu2, gcu1")
        setattr(args, key, apis)
    args.sync_bn_ranks = [int(n) for n in split_list(str(args.sync_bn_ranks))]
    return args


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for add in (_general, _overhead_and_startup, _rehearsal_and_simcost, _host_reads_and_sync_bn):
        add(p)
    return _normalise(p, p.parse_args(argv))


def _prepare(h, args, errors):
    """Build the simulator's C++ part if a section needs it; on failure only the sections
    that run without it are left."""
    if not sections.needs_simulator(args.sections, args):
        return
    compile_now = "startup" in args.sections and not args.skip_compile
    try:
        h.prepare_extension(measure_compile=compile_now)
    except Exception as e:
        log(f"extension FAILED: {e}")
        errors["extension"] = f"{type(e).__name__}: {e}"
        args.overhead_sim_runs = 0
        args.sections = [n for n in args.sections if not sections.module(n).needs_simulator(args)]


def run_sections(h, args):
    """Run the chosen sections in order; return (results, loads, errors)."""
    results, loads, errors = {}, {}, {}
    _prepare(h, args, errors)
    for name in sections.NAMES:
        if name not in args.sections:
            continue
        before, t0 = load1(), time.perf_counter()
        try:
            results[name] = sections.module(name).run(h)
        except Exception as e:  # the other sections still run and are reported
            log(f"{name} FAILED: {e}")
            errors[name] = f"{type(e).__name__}: {e}"
        loads[name] = dict(
            load1_before=before, load1_after=load1(), section_s=time.perf_counter() - t0
        )
    return results, loads, errors


def main(argv=None) -> int:
    args = parse_args(argv)
    h = harness.Harness(args)
    info = harness.machine_info(args.python)
    if info["load1_at_start"] and info["usable_cpus"]:
        if info["load1_at_start"] > 0.5 * info["usable_cpus"]:
            log(
                f"WARNING: load average {info['load1_at_start']:.1f} on "
                f"{info['usable_cpus']} CPUs: the machine is busy, timings will be noisy"
            )
    started = time.perf_counter()
    try:
        results, loads, errors = run_sections(h, args)
    finally:
        h.cleanup(args.keep)
    extension = dict(dir=h.ext_dir, untimed_build_s=h.prebuild_s)
    out = report.build(info, args, results, loads, errors, extension, time.perf_counter() - started)
    report.write(out, args.out)
    report.show(out, args.out, args.quick)
    if errors:
        return 1
    return 1 if args.check and not out["passed"] else 0


if __name__ == "__main__":
    sys.exit(main())
