"""Section 1, ``overhead``: per-iteration overhead of ``GCURunner`` over stock ``Runner``.

The same mmseg job (the tiny config on a synthetic dataset, no validation, no checkpoint,
one process, fixed seed and thread count) runs as separate processes of mmseg's stock
``tools/train.py``, in A/B pairs. Iterations are timed by mmengine's own
``IterTimerHook`` (the per-iteration ``time`` in ``vis_data/scalars.json``,
``log_processor.window_size=1``, a log line every iteration). Two sets of pairs:

- the CPU fallback (no torch_gcu): A ``GCURunner`` (the base config), B
  ``runner_type='Runner'`` and the stock ``LogProcessor`` (both import mmgcu);
- one simulated card (torch_gcu 2.x): A ``GCURunner`` (its GCU counterparts selected), B
  ``StockRunnerOnCard`` (``stock_on_card.py``: stock ``Runner``, its model moved to
  ``gcu:0``, stock wrappers and logging).

Each pair's ratio is A's median iteration time over B's. On a shared 2-core VM a run's median
moves by about 5 % from one run to the next (the same config, one run after the other), far
more than the 1 % asked for. So by default (where the machine has a CPU for each of the two)
A and B of a pair run at the same time, one process each, and see the same machine (the
kernel places them; pinning each to a CPU of its own made the pairs no tighter): an A/A
pair of the stock job then mostly agrees within 1 %, and the median of the pairs' ratios sets
aside a pair that a neighbour on the host disturbed (0.92 or 1.04 in an A/A pair). With
``--overhead-apart`` they run one after the other, A B then B A by turns, so that a linear
drift favours neither side. Target: the median of the pair ratios <= 1.01 for each set. The
ratio of all A runs' median to all B runs' median, which does not pair them, and the ratio of
the runs' fastest iterations are reported beside it.
"""

import glob
import json
import os.path as osp
import re
import shutil
import statistics
import threading

from harness import FIRST_ITER, HERE, log, median, spread_pct, usable_cpus

TITLE = "overhead"
RATIO_TARGET = 1.01


def needs_simulator(args):
    return args.overhead_sim_runs > 0


def _check_variant(text, name, placed_on, path):
    """The variant is what it claims: GCURunner's placement check logs each rank's device
    (``    rank 0 on HOST: cpu (card 0 of 1)``), Runner logs no such line."""
    found = re.search(r"rank 0 on \S+: (\S+) \(card ", text)
    placed = found.group(1) if found else None
    if placed != placed_on:
        raise RuntimeError(
            f"{name}: rank 0 placed on {placed}, expected {placed_on} (None: stock Runner); "
            f"see {path}"
        )


def _logged_times(work):
    files = glob.glob(osp.join(work, "*", "vis_data", "scalars.json"))
    if len(files) != 1:
        raise RuntimeError(f"expected one scalars.json under {work}, found {files}")
    times = []
    with open(files[0]) as f:
        for line in f:
            record = json.loads(line)
            if "time" in record and "iter" in record:
                times.append((int(record["iter"]), float(record["time"])))
    return [t for _, t in sorted(times)]


def iteration_times(h, cfg, name, simulate=None, placed_on="cpu"):
    """Per-iteration times of one tools/train.py run (IterTimerHook via scalars.json)."""
    work = h.work_dir(name)
    cmd = [h.python, h.train_script(), cfg, "--work-dir", work]
    code, wall, first, path = h.run(cmd, h.env(simulate=simulate, paths=[HERE]), name, FIRST_ITER)
    h.check(code, path, f"tools/train.py ({name})")
    with open(path) as f:
        _check_variant(f.read(), name, placed_on, path)
    times = _logged_times(work)
    kept = times[h.args.overhead_warmup :]
    if not kept:
        raise RuntimeError(f"{name}: no iteration left after the warm-up")
    shutil.rmtree(work, ignore_errors=True)
    return dict(
        median_s=statistics.median(kept),
        min_s=min(kept),
        iter_s=times,
        process_s=wall,
        first_iter_after_s=first,  # from the process's start: how far a pair's runs overlap
    )


def pair_order(pair):
    """A B for even pairs, B A for odd ones: a linear drift cancels over two pairs."""
    return "AB" if pair % 2 == 0 else "BA"


def together(h):
    """Whether a pair's A and B run at the same time: asked for, and a CPU for each."""
    return not h.args.overhead_apart and (usable_cpus() or 1) >= 2 * h.args.threads


def _pair(h, by_name, pair, at_once):
    """One pair's runs, {variant: iteration_times(...)}, started in ``pair_order(pair)``."""
    out, failed = {}, []

    def one(variant):
        name, cfg, simulate, placed = by_name[variant]
        try:
            out[variant] = iteration_times(h, cfg, f"{name}{pair}", simulate, placed)
        except Exception as error:  # re-raised by the caller's thread
            failed.append(error)

    threads = [threading.Thread(target=one, args=(v,)) for v in pair_order(pair)]
    for thread in threads:
        thread.start()
        if not at_once:
            thread.join()
    for thread in threads:
        thread.join()
    for error in failed[1:]:
        log(f"overhead: pair {pair + 1}, the other run failed too: {error!r}")
    if failed:
        raise failed[0]
    if sorted(out) != ["A", "B"]:
        raise RuntimeError(f"overhead: pair {pair + 1} has runs {sorted(out)} only")
    return out


def _interleaved(h, variants, pairs, what):
    """``pairs`` pairs of (name, config, simulate, placed_on) ``variants`` A and B."""
    runs = {"A": [], "B": []}
    by_name = dict(zip("AB", variants))
    at_once = together(h)
    how = "at the same time" if at_once else "one after the other"
    for pair in range(pairs):
        log(f"overhead: {what}, pair {pair + 1}/{pairs}, A and B {how}")
        for variant, result in _pair(h, by_name, pair, at_once).items():
            runs[variant].append(result)
    return runs


def ratios(runs, iters, warmup):
    """The paired ratio (median of A/B per pair) and the unpaired ones beside it."""
    med = {v: [r["median_s"] for r in runs[v]] for v in runs}
    low = {v: [r["min_s"] for r in runs[v]] for v in runs}
    pairs = [x / y for x, y in zip(med["A"], med["B"])]
    ratio = median(pairs)
    return dict(
        iters=iters,
        warmup_dropped=warmup,
        runs=runs,
        run_medians_s=med,
        median_A_s=median(med["A"]),
        median_B_s=median(med["B"]),
        ratio_A_over_B=ratio,
        unpaired_ratio_A_over_B=median(med["A"]) / median(med["B"]),
        min_A_s=min(low["A"]),
        min_B_s=min(low["B"]),
        min_ratio_A_over_B=min(low["A"]) / min(low["B"]),
        pair_ratios=pairs,
        # A's first logged iteration after B's, per pair (simultaneous pairs: the offset of
        # their timed windows; B's run lasts about iters x its median)
        first_iter_offsets_s=[
            None
            if a.get("first_iter_after_s") is None or b.get("first_iter_after_s") is None
            else a["first_iter_after_s"] - b["first_iter_after_s"]
            for a, b in zip(runs["A"], runs["B"])
        ],
        spread_pct=dict(A=spread_pct(med["A"]), B=spread_pct(med["B"])),
        target=f"median pair ratio <= {RATIO_TARGET}",
        passed=ratio <= RATIO_TARGET,
    )


def _simulated_card(h, data):
    a = h.args
    cfg_a = h.train_only("overhead_SA_gcurunner", data, a.overhead_sim_iters, "GCURunner")
    cfg_b = h.train_only(
        "overhead_SB_stock_on_card", data, a.overhead_sim_iters, "StockRunnerOnCard"
    )
    variants = [("overhead-simA", cfg_a, 1, "gcu:0"), ("overhead-simB", cfg_b, 1, None)]
    runs = _interleaved(h, variants, a.overhead_sim_runs, "1 simulated card (gcu2)")
    out = ratios(runs, a.overhead_sim_iters, a.overhead_warmup)
    out.update(
        together=together(h),
        what="median iteration time (s), 1 process on 1 simulated card (torch_gcu 2.x)",
        A="GCURunner (GCUOptimWrapper, GCULogProcessor, CardMessageHub)",
        B="StockRunnerOnCard: stock Runner, OptimWrapper, LogProcessor; model on gcu:0",
    )
    return out


def run(h):
    a = h.args
    data = h.dataset(a.overhead_size, train=16, val=1)
    cfg_a = h.train_only("overhead_A_gcurunner", data, a.overhead_iters, "GCURunner", "cpu")
    cfg_b = h.train_only("overhead_B_runner", data, a.overhead_iters, "Runner", "cpu")
    variants = [("overhead-A", cfg_a, None, "cpu"), ("overhead-B", cfg_b, None, None)]
    out = ratios(_interleaved(h, variants, a.overhead_pairs, "CPU"), a.overhead_iters,
                  a.overhead_warmup)  # fmt: skip
    out.update(
        what="median iteration time (s) of tools/train.py, 1 process, CPU, no torch_gcu",
        A="GCURunner (configs/_base_/gcu_runtime.py), env_cfg.device='cpu'",
        B="stock mmengine Runner + LogProcessor, same config otherwise",
        together=together(h),
        image_size=a.overhead_size,
        threads=a.threads,
    )
    if a.overhead_sim_runs:
        out["simulated_card"] = _simulated_card(h, data)  # its own row and verdict
    return out


def _ms(s):
    return None if s is None else s * 1000.0


def _rows(o, where):
    n = len(o["run_medians_s"]["A"])
    pr = o["pair_ratios"]
    verdict = "PASS" if o["passed"] else "FAIL"
    return [
        (f"iteration, stock Runner, {where} (median of {n} runs)", _ms(o["median_B_s"]), "ms",
         "", ""),
        (f"iteration, GCURunner, {where} (median of {n} runs)", _ms(o["median_A_s"]), "ms", "",
         ""),
        (f"ratio GCURunner / Runner, {where} (median of {n} pair ratios)", o["ratio_A_over_B"],
         "x", f"<= {RATIO_TARGET}", verdict),
        (f"  unpaired: median of A runs / median of B runs, {where}",
         o["unpaired_ratio_A_over_B"], "x", "info", ""),
        (f"  by the fastest iteration, {where}", o["min_ratio_A_over_B"], "x", "info", ""),
        (f"  ratio per A/B pair, min..max, {where}", f"{min(pr):.3f}..{max(pr):.3f}", "x", "",
         ""),
        (f"  spread of run medians, Runner / GCURunner, {where}",
         f"{o['spread_pct']['B']:.1f} / {o['spread_pct']['A']:.1f}", "%", "", ""),
    ]  # fmt: skip


def rows(o):
    out = _rows(o, "CPU")
    if o.get("simulated_card"):
        out += _rows(o["simulated_card"], "1 simulated card")
    return out
