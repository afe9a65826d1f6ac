"""Section 1, ``overhead``: per-iteration overhead of ``GCURunner`` over stock ``Runner``.

The same mmseg job (the tiny config on a synthetic dataset, no validation, no checkpoint,
one process, CPU, no torch_gcu, fixed seed and thread count) runs as separate processes of
mmseg's stock ``tools/train.py``, interleaved A B A B ... (A: ``GCURunner``, the base config;
B: ``runner_type='Runner'`` and the stock ``LogProcessor``; both import mmgcu). Iterations
are timed by mmengine's own ``IterTimerHook`` (the per-iteration ``time`` in
``vis_data/scalars.json``, ``log_processor.window_size=1``). Target: median(A) / median(B)
<= 1.01. Informational: ``GCURunner`` on one simulated card (its GCU counterparts selected).
"""

import glob
import json
import os.path as osp
import re
import shutil
import statistics

from harness import log, median, spread_pct

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
    code, wall, _, path = h.run(cmd, h.env(simulate=simulate), name)
    h.check(code, path, f"tools/train.py ({name})")
    with open(path) as f:
        _check_variant(f.read(), name, placed_on, path)
    times = _logged_times(work)
    kept = times[h.args.overhead_warmup :]
    if not kept:
        raise RuntimeError(f"{name}: no iteration left after the warm-up")
    shutil.rmtree(work, ignore_errors=True)
    return dict(median_s=statistics.median(kept), iter_s=times, process_s=wall)


def _interleaved(h, data):
    a = h.args
    cfg_a = h.train_only("overhead_A_gcurunner", data, a.overhead_iters, "GCURunner", "cpu")
    cfg_b = h.train_only("overhead_B_runner", data, a.overhead_iters, "Runner", "cpu")
    runs = {"A": [], "B": []}
    for pair in range(a.overhead_pairs):
        for variant, cfg in (("A", cfg_a), ("B", cfg_b)):
            log(f"overhead: pair {pair + 1}/{a.overhead_pairs}, variant {variant}")
            placed = "cpu" if variant == "A" else None
            runs[variant].append(iteration_times(h, cfg, f"overhead-{variant}{pair}", None, placed))
    return runs


def _simulated_card(h, data, cpu_median):
    a = h.args
    cfg_s = h.train_only("overhead_S_sim", data, a.overhead_sim_iters, "GCURunner")
    sim = []
    for i in range(a.overhead_sim_runs):
        log(f"overhead: GCURunner on 1 simulated card, run {i + 1}")
        sim.append(iteration_times(h, cfg_s, f"overhead-sim{i}", 1, "gcu:0"))
    sim_med = median([r["median_s"] for r in sim])
    return dict(
        what="GCURunner on 1 simulated card (gcu2): GCU counterparts selected "
        "(GCUOptimWrapper, GCULogProcessor); informational, stock Runner cannot "
        "place a model on a GCU",
        iters=a.overhead_sim_iters,
        runs=sim,
        median_s=sim_med,
        vs_cpu_A=sim_med / cpu_median,
    )


def run(h):
    a = h.args
    data = h.dataset(a.overhead_size, train=16, val=1)
    runs = _interleaved(h, data)
    med = {v: [r["median_s"] for r in runs[v]] for v in runs}
    ratio = median(med["A"]) / median(med["B"])
    out = dict(
        what="median iteration time (s) of tools/train.py, 1 process, CPU, no torch_gcu",
        A="GCURunner (configs/_base_/gcu_runtime.py), env_cfg.device='cpu'",
        B="stock mmengine Runner + LogProcessor, same config otherwise",
        order="A B per pair, pairs in sequence",
        iters=a.overhead_iters,
        warmup_dropped=a.overhead_warmup,
        image_size=a.overhead_size,
        threads=a.threads,
        runs=runs,
        run_medians_s=med,
        median_A_s=median(med["A"]),
        median_B_s=median(med["B"]),
        ratio_A_over_B=ratio,
        pair_ratios=[x / y for x, y in zip(med["A"], med["B"])],
        spread_pct=dict(A=spread_pct(med["A"]), B=spread_pct(med["B"])),
        target=f"ratio <= {RATIO_TARGET}",
        passed=ratio <= RATIO_TARGET,
    )
    if a.overhead_sim_runs:
        out["simulated_card"] = _simulated_card(h, data, out["median_A_s"])
    return out


def _ms(s):
    return None if s is None else s * 1000.0


def rows(o):
    n = len(o["run_medians_s"]["A"])
    pr = o["pair_ratios"]
    verdict = "PASS" if o["passed"] else "FAIL"
    out = [
        (f"iteration, stock Runner (median of {n} runs)", _ms(o["median_B_s"]), "ms", "", ""),
        (f"iteration, GCURunner (median of {n} runs)", _ms(o["median_A_s"]), "ms", "", ""),
        ("ratio GCURunner / Runner", o["ratio_A_over_B"], "x", f"<= {RATIO_TARGET}", verdict),
        ("ratio per A/B pair, min..max", f"{min(pr):.3f}..{max(pr):.3f}", "x", "", ""),
        (
            "spread of run medians, Runner / GCURunner",
            f"{o['spread_pct']['B']:.1f} / {o['spread_pct']['A']:.1f}",
            "%",
            "",
            "",
        ),
    ]
    s = o.get("simulated_card")
    if s:
        label = "iteration, GCURunner on 1 simulated card (gcu2)"
        out.append((label, _ms(s["median_s"]), "ms", "info", ""))
        out.append(("simulated card / CPU GCURunner", s["vs_cpu_A"], "x", "info", ""))
    return out
