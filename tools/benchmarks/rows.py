"""The rows of docs/performance.md (``| what | value | target |``), one function per bench
section, from that section's results in a bench report (``performance.py`` writes the doc)."""

from sections.host_reads import VARIANTS, one_time

ROW = "| {} | {} | {} |"


def _ms(s):
    return f"{s * 1000.0:.1f} ms"


def _s(s):
    return f"{s:.3f} s" if s < 0.1 else (f"{s:.2f} s" if s < 10 else f"{s:.1f} s")


def overhead(o):
    out = [_overhead_row(o, "CPU, no torch_gcu", "stock `Runner`")]
    if o.get("simulated_card"):
        where = "1 simulated card (torch_gcu 2.x)"
        out.append(_overhead_row(o["simulated_card"], where, "stock `Runner` on the card"))
    return out


def _overhead_row(o, where, stock):
    pr = o["pair_ratios"]
    what = (
        f"per-iteration time, {stock} vs `GCURunner` (same mmseg job, 1 process, {where}; "
        f"{len(pr)} A/B pairs, {_pairing(o)}; median of the pair ratios)"
    )
    value = (
        f"{_ms(o['median_B_s'])} vs {_ms(o['median_A_s'])}: ratio **{o['ratio_A_over_B']:.3f}**"
        f" (pairs {min(pr):.3f}–{max(pr):.3f}; unpaired {o['unpaired_ratio_A_over_B']:.3f};"
        f" fastest iterations {o['min_ratio_A_over_B']:.3f})"
    )
    return ROW.format(what, value, "≤ 1.01")


def _pairing(o):
    return "A and B at the same time" if o.get("together") else "one after the other"


def startup(st):
    no_sim, sim = st["import_no_sim"], st["import_sim8_cached"]
    out = [
        ROW.format(
            "`import mmgcu` (torch and mmengine included / mmgcu itself)",
            f"{_s(no_sim['median_total_s'])} / {_s(no_sim['median_mmgcu_s'])}",
            "",
        )
    ]
    first = st.get("sim_first_run_compiles")
    value = _s(sim["median_total_s"]) + (f" / {_s(first['total_s'])}" if first else " / n/a")
    out.append(
        ROW.format(
            "`import mmgcu` with the simulator, compiled part cached / first run (compiles)",
            value,
            "",
        )
    )
    cpu, card = st["launch_cpu_no_sim"], st["launch_sim1_cached"]
    launch = f"{_s(cpu['median_first_iter_s'])} / {_s(card['median_first_iter_s'])}"
    what = "launch to first training iteration, `tools/train.py`, CPU / 1 simulated card"
    return out + [ROW.format(what, launch, "")]


def _exits(apis):
    failed = [api for api, r in apis.items() if not r["all_exit_0"]]
    return f"**exit ≠ 0 ({', '.join(failed)})**" if failed else "every run exit 0"


def rehearsal(result):
    apis = result["apis"]
    names = " / ".join(apis)
    walls = " / ".join(f"**{_s(r['median_wall_s'])}**" for r in apis.values())
    codes = _exits(apis)
    what = (
        "**8-rank simulated rehearsal** of the tiny config "
        f"(`MMGCU_SIMULATE=8 tools/dist_train.sh`), {names}"
    )
    out = [ROW.format(what, f"{walls}, {codes}", "< 60 s")]
    amp = {a: r for a, r in apis.items() if "amp_median_s" in r}
    if amp:
        value = " / ".join(
            f"{_s(r['amp_median_s'])} ({r['amp_over_fp32']:.2f}× fp32)" for r in amp.values()
        )
        n = min(len(r["amp_pair_ratios"]) for r in amp.values())
        what = (
            f"rehearsal with `--amp`, {' / '.join(amp)} (× fp32: median over {n} runs, each "
            "against the fp32 run next to it)"
        )
        out.append(ROW.format(what, value, "info"))
    for api, r in apis.items():
        if "baseline_median_s" in r:
            pr = r["pair_ratios"]
            what = (
                f"{api} rehearsal vs the baseline commit `{r['baseline_commit'][:7]}` "
                f"(its simulated API `{r['baseline_api']}`; {len(pr)} "
                "interleaved pairs, median)"
            )
            value = (
                f"{_s(r['median_wall_s'])} vs {_s(r['baseline_median_s'])}: ratio "
                f"**{r['new_over_baseline']:.2f}** (pairs {min(pr):.2f}–{max(pr):.2f}"
            )
            if "cpu_new_over_baseline" in r:
                value += f"; CPU time {r['cpu_new_over_baseline']:.2f}"
            value += ")"
            out.append(ROW.format(what, value, "≤ 1.2"))
    return out


def _us_range(values):
    low, high = f"{min(values):+.1f}", f"{max(values):+.1f}"
    return f"{low} µs" if low == high else f"{low} to {high} µs"


def simcost(sc):
    parts = []
    for c in sc.values():
        m = c["step_median_s"]
        parts.append(f"{_ms(m['cpu'])} vs {_ms(m['card'])} ({m['ratio']:.2f}×)")
    names = " / ".join(sc)
    what = f"simulator cost: train step of the tiny model, CPU vs simulated card ({names})"
    per_api = []
    for c in sc.values():
        small = [r["overhead_us"] for op, r in c["ops"].items() if not op.startswith("conv2d")]
        conv = [r["overhead_us"] for op, r in c["ops"].items() if op.startswith("conv2d")]
        per_api.append(f"{_us_range(small)}; {_us_range(conv)}")
    value = " / ".join(per_api)
    per_op = f"simulator cost per small op (64×64 add, mul_, matmul, relu, sum; 3×3 conv), {names}"
    return [ROW.format(what, " / ".join(parts), "info"), ROW.format(per_op, value, "info")]


def host_reads(result):
    apis = result["apis"]
    interval = result["log_interval"]
    what = (
        "**card reads per iteration** (waits for the card) after the first log interval, "
        "mmgcu vs stock mmengine logging (`gcu_defer_scalars=False`); mmseg "
        f"`{result['config'].split('/')[-1]}`, 64×64, {result['ranks']} ranks, "
        f"{result['iters']} iterations, log every {interval}; {' / '.join(apis)}"
    )
    value = " / ".join(_versus(r, bold=True) for r in apis.values())
    out = [ROW.format(what, value, f"{1 / interval:g} (one per log line)")]
    first = " / ".join(one_time(r["mmgcu"]) for r in apis.values())
    what = "one-time reads per rank (first interval and after_train), mmgcu"
    out.append(ROW.format(what, first, ""))
    amp = []
    for api, r in apis.items():
        for variant in ("amp_zero", "amp_skip"):
            if variant in r:
                mode = VARIANTS[variant][1]
                amp.append(f"{api} `{mode}` {r[variant]['steady_per_iter']:.2f}")
    if amp:
        what = "card reads per iteration with `--amp`, by `overflow_step` (same run otherwise)"
        out.append(ROW.format(what, ", ".join(amp), f"`zero`: {1 / interval:g}"))
    if "gcu1" in apis:
        what = "lazy graph runs per iteration (gcu1), mmgcu vs stock logging"
        runs = apis["gcu1"]
        value = f"{runs['mmgcu']['per_iter']['graph_runs']:.2f} vs "
        value += f"{runs['stock']['per_iter']['graph_runs']:.2f}"
        out.append(ROW.format(what, value, ""))
    return out


def _versus(r, bold=False):
    mine = f"{r['mmgcu']['steady_per_iter']:.2f}"
    return f"{f'**{mine}**' if bold else mine} vs {r['stock']['steady_per_iter']:.2f}"


def sync_bn(result):
    out = []
    for n, by_rank in result["ranks"].items():
        for shape, r in by_rank["shapes"].items():
            what = (
                f"one `GCUSyncBatchNorm` vs torch's `SyncBatchNorm` algorithm (same gloo group) "
                f"and `BatchNorm2d`, forward+backward, {shape} per rank, {n} ranks (CPU)"
            )
            value = (
                f"{r['gcu_sync_bn_ms']:.2f} vs {r['torch_sync_bn_ms']:.2f} vs {r['bn_ms']:.2f} "
                f"ms: **{r['gcu_sync_bn_over_torch']:.2f}×** torch's; {r['collectives_forward']}"
                f"+{r['collectives_backward']} sums over the card group per call (on gloo at "
                "this size a gather to rank 0 and a broadcast each; torch: 1 all-gather + 1 "
                "all-reduce)"
            )
            out.append(ROW.format(what, value, "≤ 1.0"))
    return out


def graphs(result):
    """Section 7: the simulated T20 card's lazy graph kept against ``MMGCU_SIM_XLA=off``."""
    runs, pr = result["runs"], result["pair_ratios"]
    pairs = [runs[i : i + 2] for i in range(0, len(runs), 2)]
    walls = ", ".join(
        " / ".join(f"{r['wall_s']:.1f}" for p in ("t20", "off") for r in pair if r["profile"] == p)
        for pair in pairs
    )
    what = (
        "the simulated card's lazy graph (hash per op, cuts, compile cache) kept vs off "
        "(`MMGCU_SIM_XLA=off`): 8-rank T20 run of the tiny config "
        f"({len(pr)} interleaved pairs, median)"
    )
    value = f"kept / off {walls} s: ratio **{result['ratio']:.2f}** ({_range(pr)})"
    if not result["all_exit_0"]:
        value += ", **exit ≠ 0**"
    return [ROW.format(what, value, "≤ 1.10")]


def _range(ratios):
    return f"pairs {min(ratios):.2f}–{max(ratios):.2f}"


def padding(result):
    """Section 8: validation metrics at each image's size against padded to shape buckets."""
    metrics = ("mIoU", "aAcc", "mAcc")
    sides = [side for size in result["sizes"] for side in size]
    what = (
        "`make demo`'s model (8 simulated T20 cards, 40 iterations), validated on "
        f"{result['images']} images of {len(result['sizes'])} sizes ({min(sides)} to "
        f"{max(sides)} px a side): each image at its own size / padded to mmgcu's shape buckets"
    )
    own, padded = result["own_size"], result["padded"]
    value = ", ".join(f"{m} {own[m]:.2f} / {padded[m]:.2f}" for m in metrics)
    control = result["control"]["difference"]
    what_control = (
        f"the same on {4 * len(result['buckets'])} images whose sizes are buckets already "
        "(the control): padded minus own size"
    )
    value_control = ", ".join(f"{m} {control[m]:+.2f}" for m in metrics)
    return [ROW.format(what, value, "info"), ROW.format(what_control, value_control, "0")]


#: The row functions, by section name.
SECTIONS = dict(
    overhead=overhead,
    startup=startup,
    rehearsal=rehearsal,
    simcost=simcost,
    host_reads=host_reads,
    sync_bn=sync_bn,
    graphs=graphs,
    padding=padding,
)


def section(name, result):
    """The rows of section ``name`` from its ``result``."""
    return SECTIONS[name](result)
