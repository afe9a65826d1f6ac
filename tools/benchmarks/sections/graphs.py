"""Section 7, ``graphs``: what the simulated XLA card's lazy graph costs a rehearsal.

The simulated T20 card (torch_gcu 1.x) keeps the account of its lazy graph for every op: a
hash per op, the cuts, the compile cache (``mmgcu/sim/csrc/lazy_graph.h``). This section
runs the 8-rank training of section 3 (``MMGCU_SIMULATE=t20 tools/dist_train.sh`` on the
tiny config) with the graph kept (the default ``t20`` profile) and without
(``MMGCU_SIM_XLA=off``), in interleaved pairs (the order alternating), and takes the median
of the pairs' ratios. Target: at most 1.10 (a rehearsal at most 10 % slower). The tiny
model's ops are small, so the hash per op weighs more here than in a real config's
rehearsal: this is the worst case.
"""

from harness import log, median

TITLE = "graphs"
RATIO_TARGET = 1.10
VARIANTS = ("off", "t20")


def needs_simulator(args):
    return True


def _one(h, cfg, profile, index):
    name = f"graphs-{profile}{index}"
    work = h.work_dir(name)
    cmd = ["bash", "tools/dist_train.sh", cfg, "--work-dir", work]
    env = h.env(simulate="t20", api="gcu1", PYTHON=h.python, MMGCU_SIM_XLA=profile)
    code, wall, _, _ = h.run(cmd, env, name)
    return dict(profile=profile, exit_code=code, wall_s=wall, cpu_s=h.last_cpu_s)


def order(pair: int):
    """The profiles of a pair, alternating which runs first."""
    return VARIANTS if pair % 2 == 0 else VARIANTS[::-1]


def summary(runs):
    """The pairs' kept / off ratios, their median and the verdict."""
    walls = {p: [x["wall_s"] for x in runs if x["profile"] == p] for p in VARIANTS}
    ratios = [kept / off for off, kept in zip(walls["off"], walls["t20"])]
    out = dict(
        what="MMGCU_SIMULATE=t20 tools/dist_train.sh <tiny config>, MMGCU_SIM_XLA=off | t20",
        target=f"kept / off <= {RATIO_TARGET}",
        runs=runs,
        pair_ratios=ratios,
        ratio=median(ratios),
        all_exit_0=all(x["exit_code"] == 0 for x in runs),
    )
    out["passed"] = out["all_exit_0"] and out["ratio"] <= RATIO_TARGET
    return out


def run(h):
    cfg = h.config("graphs", h.dataset(64))
    runs = []
    for pair in range(h.args.graphs_pairs):
        for profile in order(pair):
            log(f"graphs: 8 simulated T20 cards, graph {profile}, pair {pair + 1}")
            runs.append(_one(h, cfg, profile, pair))
    return summary(runs)


def rows(result):
    r, n = result["pair_ratios"], len(result["pair_ratios"])
    verdict = "PASS" if result["passed"] else "FAIL"
    return [
        (f"8-rank T20 run, graph kept / off (median of {n} interleaved pairs)", result["ratio"],
         "x", f"<= {RATIO_TARGET}", verdict),
        ("kept / off, per pair, min..max", f"{min(r):.3f}..{max(r):.3f}", "x", "", ""),
    ]  # fmt: skip
