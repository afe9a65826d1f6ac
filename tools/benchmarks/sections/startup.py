"""Section 2, ``startup``: ``import mmgcu`` in a fresh interpreter (``import_time.py``),
without and with the simulator (the first run with an empty extension cache compiles its
C++ part: timed by the harness before any section), and the time from launch to the first
training iteration of ``tools/train.py`` (``time.perf_counter`` around the child, up to its
first ``Iter(train) [`` line).
"""

import shutil

from harness import FIRST_ITER, log, median

TITLE = "start-up"
IMPORT_FIELDS = ("total_s", "torch_s", "mmengine_s", "mmgcu_s", "process_s")
IMPORTS = (("no_sim", None, "no simulator"), ("sim8_cached", 8, "MMGCU_SIMULATE=8, cached"))
LAUNCHES = (("cpu_no_sim", None, "CPU, no simulator"), ("sim1_cached", 1, "1 simulated card"))


def needs_simulator(args):
    return True


def first_iteration(h, cfg, name, simulate=None):
    work = h.work_dir(name)
    cmd = [h.python, h.train_script(), cfg, "--work-dir", work]
    code, wall, seen, path = h.run(cmd, h.env(simulate=simulate), name, FIRST_ITER)
    h.check(code, path, f"tools/train.py ({name})")
    if seen is None:
        raise RuntimeError(f"{name}: no {FIRST_ITER!r} line in {path}")
    shutil.rmtree(work, ignore_errors=True)
    return dict(first_iter_s=seen, process_s=wall)


def _imports(h):
    n = h.args.import_repeats
    runs = {key: [] for key, _, _ in IMPORTS}
    for i in range(n):
        for key, simulate, _ in IMPORTS:
            log(f"startup: import mmgcu ({key}) {i + 1}/{n}")
            runs[key].append(h.import_time(simulate, f"import-{key}"))
    return {
        f"import_{key}": dict(
            runs=r, **{f"median_{f}": median([x[f] for x in r]) for f in IMPORT_FIELDS}
        )
        for key, r in runs.items()
    }


def _launches(h):
    a = h.args
    cfg = h.train_only("launch", h.dataset(64), a.launch_iters)
    runs = {key: [] for key, _, _ in LAUNCHES}
    for i in range(a.launch_runs):
        for key, simulate, _ in LAUNCHES:
            log(f"startup: launch to first iteration ({key}) {i + 1}/{a.launch_runs}")
            runs[key].append(first_iteration(h, cfg, f"launch-{key}{i}", simulate))
    return {
        f"launch_{key}": dict(
            runs=r,
            median_first_iter_s=median([x["first_iter_s"] for x in r]),
            median_process_s=median([x["process_s"] for x in r]),
        )
        for key, r in runs.items()
    }


def run(h):
    out = {"sim_first_run_compiles": h.compile_run}
    out.update(_imports(h))
    out.update(_launches(h))
    return out


def rows(st):
    out = []
    for key, _, label in IMPORTS:
        r = st[f"import_{key}"]
        out.append((f"import mmgcu, fresh interpreter ({label})", r["median_total_s"], "s"))
        out.append((f"  of which mmgcu itself ({label})", r["median_mmgcu_s"], "s"))
        out.append((f"  process wall time ({label})", r["median_process_s"], "s"))
    c = st.get("sim_first_run_compiles")
    if c:
        out.append(("import mmgcu, simulator, first run (compiles C++)", c["total_s"], "s"))
        out.append(("  process wall time (first run, compiles)", c["process_s"], "s"))
    for key, _, label in LAUNCHES:
        r = st[f"launch_{key}"]
        what = f"launch to first iteration, tools/train.py ({label})"
        out.append((what, r["median_first_iter_s"], "s"))
    return [row + ("", "") for row in out]
