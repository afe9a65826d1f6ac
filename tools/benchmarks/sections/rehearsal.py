"""Section 3, ``rehearsal``: wall time of ``MMGCU_SIMULATE=8 tools/dist_train.sh`` on the tiny
config (8 ranks, cached extension), for each simulated API (``--rehearsal-apis``), fp32 and
``--amp``. Target: under 60 s on a 2-core machine, exit code 0.

For torch_gcu 1.x (``gcu1``) the same rehearsal also runs on a baseline commit
(``--rehearsal-baseline``, default ``14e0974``, whose simulator names this API ``legacy``),
checked out in a throwaway ``git worktree`` in the scratch folder, with its own
``dist_train.sh`` and tiny config. The baseline's runs and this tree's are interleaved in
pairs (the order alternating from pair to pair); target: median(this tree) / median(baseline)
<= 1.2. The ``--amp`` runs are interleaved with the fp32 ones too (each against the fp32
run of its round, median of those ratios); informational.
"""

import os.path as osp
import re
import shutil

from harness import REPO, TINY_REL, load1, log, median

TITLE = "rehearsal"
WALL_TARGET_S = 60.0
BASELINE_RATIO_TARGET = 1.2
VARIANTS = ("fp32", "baseline", "amp")


def needs_simulator(args):
    return True


def plan(runs, pairs, amp_runs):
    """The runs in order: a list of rounds, each a list of variants. Every round has an fp32
    run, so each baseline and each --amp run has a partner run in its round; the baseline and
    this tree alternate their order from round to round, so a drift of the machine's load
    hits both."""
    counts = dict(fp32=max(runs, pairs, amp_runs), baseline=pairs, amp=amp_runs)
    rounds = []
    for r in range(max(counts.values())):
        pair = ["fp32", "baseline"] if r % 2 == 0 else ["baseline", "fp32"]
        rounds.append([v for v in pair + ["amp"] if r < counts[v]])
    return rounds


def simulated_banner(api: str, old: bool) -> str:
    """What the simulator's notice says of ``api``: the baseline commit's names the API
    (``legacy``); this tree's names the torch_gcu generation (``SIMULATED (T20: the torch_gcu
    1.x API``)."""
    if old:
        return f"SIMULATED ({api} API"
    return f"the torch_gcu {dict(gcu1='1.x', gcu2='2.x')[api]} API"


def _one(h, api, variant, cfg, baseline, index):
    old = variant == "baseline"
    tree = baseline["tree"] if old else REPO
    name = f"rehearsal-{api}-{variant}{index}"
    work = h.work_dir(name)
    cmd = ["bash", osp.join(tree, "tools", "dist_train.sh"), cfg, "--work-dir", work]
    cmd += ["--amp"] if variant == "amp" else []
    sim_api = baseline["api"] if old else api
    env = h.env(simulate=8, api=sim_api, tree=tree, PYTHON=h.python)
    before = load1()
    code, wall, _, path = h.run(cmd, env, name, cwd=tree)
    with open(path) as f:
        text = f.read()
    if code == 0 and simulated_banner(sim_api, old) not in text:
        raise RuntimeError(f"{name}: not the simulated {sim_api} API of {tree}; see {path}")
    miou = re.findall(r"mIoU: ([0-9.]+)", text)
    result = dict(
        variant=variant,
        exit_code=code,
        wall_s=wall,
        cpu_s=h.last_cpu_s,
        load1_before=before,
        miou=float(miou[-1]) if miou else None,
        checkpoint=osp.exists(osp.join(work, "iter_4.pth")),
        log=osp.basename(path),
    )
    if code == 0:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _summary(api, runs, baseline):
    walls = {v: [r["wall_s"] for r in runs if r["variant"] == v] for v in VARIANTS}
    cpus = {v: [r.get("cpu_s") for r in runs if r["variant"] == v] for v in VARIANTS}
    fp32 = median(walls["fp32"])
    out = dict(api=api, runs=runs, fp32_walls_s=walls["fp32"], median_wall_s=fp32)
    out["all_exit_0"] = all(r["exit_code"] == 0 for r in runs)
    passed = out["all_exit_0"] and fp32 < WALL_TARGET_S
    if walls["amp"]:
        out.update(amp_walls_s=walls["amp"], amp_median_s=median(walls["amp"]))
        # Each --amp run against the fp32 run of its round (the first rounds have both).
        out["amp_pair_ratios"] = [a / f for f, a in zip(walls["fp32"], walls["amp"])]
        out["amp_over_fp32"] = median(out["amp_pair_ratios"])
    if baseline:
        old = walls["baseline"]
        out.update(baseline_commit=baseline["commit"], baseline_api=baseline["api"])
        out.update(baseline_walls_s=old, baseline_median_s=median(old))
        out["new_over_baseline"] = fp32 / out["baseline_median_s"]
        out["pair_ratios"] = [n / o for n, o in zip(walls["fp32"], old)]
        out["baseline_passed"] = out["new_over_baseline"] <= BASELINE_RATIO_TARGET
        if None not in cpus["fp32"] + cpus["baseline"]:  # informational: CPU time of all ranks
            out["cpu_new_over_baseline"] = median(cpus["fp32"]) / median(cpus["baseline"])
        passed = passed and out["baseline_passed"]
    out["passed"] = passed
    return out


def _rehearse(h, api, cfgs, baseline):
    a = h.args
    pairs = a.rehearsal_baseline_pairs if baseline else 0
    runs = []
    for r, variants in enumerate(plan(a.rehearsal_runs, pairs, a.rehearsal_amp_runs)):
        for variant in variants:
            log(f"rehearsal: 8 simulated cards ({api}), {variant}, round {r + 1}")
            cfg = cfgs["baseline" if variant == "baseline" else "new"]
            runs.append(_one(h, api, variant, cfg, baseline, r))
    return _summary(api, runs, baseline)


def run(h):
    a = h.args
    data = h.dataset(64)
    cfgs = {"new": h.config("rehearsal", data)}
    out = dict(
        what="MMGCU_SIMULATE=8 tools/dist_train.sh <tiny config> --work-dir W [--amp]",
        target=f"< {WALL_TARGET_S:.0f} s, exit code 0; gcu1 / baseline <= {BASELINE_RATIO_TARGET}",
        apis={},
    )
    for api in a.rehearsal_apis:
        baseline = None
        if api == "gcu1" and a.rehearsal_baseline:
            baseline = h.baseline(a.rehearsal_baseline, api="legacy")
            old_tiny = osp.join(baseline["tree"], TINY_REL)
            cfgs["baseline"] = h.config("rehearsal_baseline", data, base=old_tiny)
        out["apis"][api] = _rehearse(h, api, cfgs, baseline)
    out["passed"] = all(r["passed"] for r in out["apis"].values())
    return out


def _verdict(ok):
    return "PASS" if ok else "FAIL"


def _api_rows(api, r):
    n = len(r["fp32_walls_s"])
    codes = ",".join(str(x["exit_code"]) for x in r["runs"])
    wall_ok = r["median_wall_s"] < WALL_TARGET_S
    out = [
        (f"8-rank simulated run ({api}), dist_train.sh, wall, median of {n}",
         r["median_wall_s"], "s", f"< {WALL_TARGET_S:.0f}", _verdict(wall_ok)),
        (f"exit code(s) ({api}, all runs)", codes, "", "0", _verdict(r["all_exit_0"])),
    ]  # fmt: skip
    if "amp_median_s" in r:
        out.append((f"--amp run ({api}), wall", r["amp_median_s"], "s", "info", ""))
        what = f"--amp / fp32 ({api}, median of {len(r['amp_pair_ratios'])} same-round pairs)"
        out.append((what, r["amp_over_fp32"], "x", "info", ""))
    if "baseline_median_s" in r:
        pr, commit = r["pair_ratios"], r["baseline_commit"][:7]
        what = f"baseline commit {commit} ('{r['baseline_api']}'), wall, median of"
        out += [
            (f"{what} {len(r['baseline_walls_s'])}", r["baseline_median_s"], "s", "", ""),
            (f"{api} / baseline ({len(pr)} interleaved pairs, medians)", r["new_over_baseline"],
             "x", f"<= {BASELINE_RATIO_TARGET}", _verdict(r["baseline_passed"])),
            (f"{api} / baseline, per pair, min..max", f"{min(pr):.3f}..{max(pr):.3f}", "x", "", ""),
        ]  # fmt: skip
        if "cpu_new_over_baseline" in r:
            what = f"{api} / before, CPU time (user+sys of all ranks), medians"
            out.append((what, r["cpu_new_over_baseline"], "x", "info", ""))
    return out


def rows(result):
    out = []
    for api, r in result["apis"].items():
        out += _api_rows(api, r)
    return out
