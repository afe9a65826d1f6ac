"""mmgcu performance benchmark (``make bench``): prints a table and writes it as JSON.

Sections (``--sections``, all by default):

1. ``overhead``: per-iteration overhead of ``GCURunner`` over stock mmengine ``Runner``.
   The same mmseg job (the tiny config on a synthetic dataset, no validation, no
   checkpoint, one process, CPU, no torch_gcu, fixed seed and thread count) runs as
   separate processes of mmseg's stock ``tools/train.py``, interleaved A B A B ...
   (A: ``GCURunner``, the base config; B: ``runner_type='Runner'`` and the stock
   ``LogProcessor``; both import mmgcu). Target: median(A) / median(B) <= 1.01.
   Informational: ``GCURunner`` on one simulated card (its GCU counterparts selected).
2. ``startup``: ``import mmgcu`` in a fresh interpreter, without and with the simulator
   (the first run with an empty extension cache compiles its C++ part), and the time
   from launch to the first training iteration of ``tools/train.py``.
3. ``rehearsal``: wall time of ``MMGCU_SIMULATE=8 tools/dist_train.sh`` on the tiny
   config (8 ranks, cached extension). Target: under 60 s on a 2-core machine.
4. ``simcost``: a simulated card against the same model on the plain CPU, in one process:
   a training step and single ops (``tools/benchmarks/simcost.py``). A simulated card
   says nothing about GCU speed; this says what a rehearsal costs.

Harnesses: training iterations are timed by mmengine's own ``IterTimerHook`` (the per-
iteration ``time`` in ``vis_data/scalars.json``, with ``log_processor.window_size=1`` so
each value is one iteration, not a 10-iteration mean); in-process timings use the
standard library's :mod:`timeit`; process wall times use ``time.perf_counter`` in this
process around the child. Every child gets ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` =
``--threads`` and its own extension cache (``TORCH_EXTENSIONS_DIR``), so other checkouts
sharing ``~/.cache/torch_extensions`` cannot trigger a rebuild mid-run.

Defaults take about 5-8 minutes on a quiet 2-core machine; ``--quick`` is a smoke run
(about 2-3 minutes, most of it the one compile). Run on a quiet machine: the 1-minute load
average before and after each section is recorded, and a busy start is flagged.

    python tools/benchmarks/bench.py [--quick] [--sections overhead,startup] [--out FILE]
"""

import argparse
import datetime
import glob
import importlib.util
import json
import os
import os.path as osp
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
HERE = osp.dirname(osp.abspath(__file__))
TINY = osp.join(REPO, "configs", "tiny", "fcn_r18-tiny_8xgcu_synthetic-64x64.py")
SECTIONS = ("overhead", "startup", "rehearsal", "simcost")
FIRST_ITER = "Iter(train) ["
RATIO_TARGET = 1.01
REHEARSAL_TARGET_S = 60.0
# Variables that would change what a child runs (a launcher's, the simulator's, a card list).
DROPPED_ENV = ("MMGCU_", "TOPS_", "LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC_")


# -- small helpers -------------------------------------------------------------------
def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(values):
    return statistics.median(values) if values else None


def spread_pct(values):
    """(max - min) / median of ``values``, in percent."""
    if not values:
        return None
    return (max(values) - min(values)) / statistics.median(values) * 100.0


def load1():
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


class Bench:
    """Runs the children; holds the temporary folders and the results."""

    def __init__(self, args):
        self.args = args
        self.python = args.python
        self.root = args.workdir or tempfile.mkdtemp(prefix="mmgcu-bench-")
        os.makedirs(self.root, exist_ok=True)
        self.ext_dir = args.ext_dir or osp.join(self.root, "torch_extensions")
        self.compile_run = None
        self.prebuild_s = None
        self.counter = 0
        self._datasets = {}

    # -- environment and processes ---------------------------------------------------
    def env(self, simulate=None, api="v2", ext_dir=None, **extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED_ENV)}
        env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.args.threads)
        env["TORCH_EXTENSIONS_DIR"] = ext_dir or self.ext_dir
        if simulate:
            env["MMGCU_SIMULATE"] = str(simulate)
            env["MMGCU_SIMULATE_API"] = api
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def run(self, cmd, env, name, marker=None, timeout=None):
        """Run ``cmd``; return (exit code, wall s, s until ``marker`` was printed, log path).

        stdout and stderr are merged into ``<root>/logs/<n>-<name>.log``.
        """
        self.counter += 1
        os.makedirs(osp.join(self.root, "logs"), exist_ok=True)
        path = osp.join(self.root, "logs", f"{self.counter:03d}-{name}.log")
        seen = None
        start = time.perf_counter()
        with open(path, "w") as out:
            proc = subprocess.Popen(
                cmd,
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
            # Past the limit: SIGTERM (torchrun stops its own workers), SIGKILL 30 s later.
            # Only the child this bench started is signalled.
            expired = threading.Event()

            def stop():
                expired.set()
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()

            timer = threading.Timer(timeout or self.args.timeout, stop)
            timer.start()
            try:
                for line in proc.stdout:
                    if seen is None and marker is not None and marker in line:
                        seen = time.perf_counter() - start
                    out.write(line)
                code = proc.wait()
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            finally:
                timer.cancel()
        if expired.is_set():
            raise RuntimeError(f"{name} ran past {timeout or self.args.timeout:.0f} s; log {path}")
        return code, time.perf_counter() - start, seen, path

    def check(self, code, path, what):
        if code != 0:
            with open(path) as f:
                tail = f.read()[-4000:]
            raise RuntimeError(f"{what} exited with {code}; log {path}:\n{tail}")

    def last_json(self, path):
        with open(path) as f:
            lines = f.read().strip().splitlines()
        for line in reversed(lines):
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"no JSON line in {path}")

    # -- inputs ----------------------------------------------------------------------
    def dataset(self, size, train=16, val=16):
        key = (size, train, val)
        if key not in self._datasets:
            root = osp.join(self.root, f"data{size}_{train}_{val}")
            cmd = [self.python, osp.join(REPO, "tools", "make_synthetic_dataset.py"), root]
            cmd += ["--size", str(size), "--train", str(train), "--val", str(val)]
            code, _, _, path = self.run(cmd, self.env(), f"dataset{size}")
            self.check(code, path, "tools/make_synthetic_dataset.py")
            self._datasets[key] = root
        return self._datasets[key]

    def config(self, name, data_root, lines=()):
        """A config inheriting the tiny config on ``data_root``, plus ``lines``."""
        path = osp.join(self.root, "configs", f"{name}.py")
        os.makedirs(osp.dirname(path), exist_ok=True)
        text = [
            f"_base_ = [{TINY!r}]",
            f"data_root = {data_root!r}",
            "train_dataloader = dict(dataset=dict(data_root=data_root))",
            "val_dataloader = dict(dataset=dict(data_root=data_root))",
            "test_dataloader = val_dataloader",
        ] + list(lines)
        with open(path, "w") as f:
            f.write("\n".join(text) + "\n")
        return path

    def train_only(self, name, data_root, iters, runner="GCURunner", device="auto"):
        """A training-only job: no validation, no checkpoint, every iteration logged."""
        stock = runner == "Runner"
        processor = "LogProcessor" if stock else "GCULogProcessor"
        return self.config(
            name,
            data_root,
            [
                "val_dataloader = None",
                "val_cfg = None",
                "val_evaluator = None",
                "test_dataloader = None",
                "test_cfg = None",
                "test_evaluator = None",
                f"train_cfg = dict(type='IterBasedTrainLoop', max_iters={iters}, "
                f"val_interval={iters + 1})",
                "param_scheduler = [dict(type='PolyLR', eta_min=1e-4, power=0.9, begin=0, "
                f"end={iters}, by_epoch=False)]",
                "default_hooks = dict(logger=dict(interval=1), "
                f"checkpoint=dict(interval={iters + 1}, save_last=False))",
                # window_size=1: the logged 'time' is this iteration's, not a 10-iter mean
                f"log_processor = dict(type={processor!r}, by_epoch=False, window_size=1)",
                f"runner_type = {runner!r}",
                f"env_cfg = dict(device={device!r})",
                "randomness = dict(seed=0)",
            ],
        )

    def train_script(self):
        spec = importlib.util.find_spec("mmseg")
        if spec is None or spec.origin is None:
            raise RuntimeError("mmseg is not importable by this interpreter")
        return osp.join(osp.dirname(spec.origin), ".mim", "tools", "train.py")

    def prepare_extension(self, measure_compile):
        """Build the simulator's C++ part once, before any section.

        With ``measure_compile``, the build is the timed first run: ``import mmgcu`` with
        the simulator and an empty ``TORCH_EXTENSIONS_DIR``. Without ``--ext-dir`` that
        folder then serves every later (cached) run.
        """
        if measure_compile:
            fresh = osp.join(self.root, "torch_extensions_fresh")
            shutil.rmtree(fresh, ignore_errors=True)
            log("extension: import mmgcu with the simulator, empty cache (compiles C++)")
            self.compile_run = self.import_time(1, "import-compile", ext_dir=fresh)
            if not self.args.ext_dir:
                self.ext_dir = fresh
                return
        log(f"extension: making sure it is built in {self.ext_dir} (untimed)")
        cmd = [self.python, "-m", "mmgcu.sim.build"]
        code, wall, _, path = self.run(cmd, self.env(simulate=1), "ext-build")
        self.check(code, path, "python -m mmgcu.sim.build")
        self.prebuild_s = wall

    # -- 1. per-iteration overhead -----------------------------------------------------
    def iteration_times(self, cfg, name, simulate=None, placed_on="cpu"):
        """Per-iteration times of one tools/train.py run (IterTimerHook via scalars.json)."""
        work = osp.join(self.root, "work", name)
        cmd = [self.python, self.train_script(), cfg, "--work-dir", work]
        code, wall, _, path = self.run(cmd, self.env(simulate=simulate), name)
        self.check(code, path, f"tools/train.py ({name})")
        with open(path) as f:
            text = f.read()
        # The variant is what it claims: GCURunner logs its placement check, Runner does not.
        gcu_runner = "mmgcu placement" in text
        if gcu_runner != (placed_on is not None) or (
            placed_on and not re.search(rf"rank 0 on \S+: {re.escape(placed_on)} \(", text)
        ):
            raise RuntimeError(f"{name}: not the runner/device it should be; see {path}")
        files = glob.glob(osp.join(work, "*", "vis_data", "scalars.json"))
        if len(files) != 1:
            raise RuntimeError(f"expected one scalars.json under {work}, found {files}")
        times = []
        with open(files[0]) as f:
            for line in f:
                record = json.loads(line)
                if "time" in record and "iter" in record:
                    times.append((int(record["iter"]), float(record["time"])))
        times = [t for _, t in sorted(times)]
        kept = times[self.args.overhead_warmup :]
        if not kept:
            raise RuntimeError(f"{name}: no iteration left after the warm-up")
        shutil.rmtree(work, ignore_errors=True)
        return dict(median_s=statistics.median(kept), iter_s=times, process_s=wall)

    def section_overhead(self):
        a = self.args
        data = self.dataset(a.overhead_size, train=16, val=1)
        cfg_a = self.train_only("overhead_A_gcurunner", data, a.overhead_iters, "GCURunner", "cpu")
        cfg_b = self.train_only("overhead_B_runner", data, a.overhead_iters, "Runner", "cpu")
        runs = {"A": [], "B": []}
        for pair in range(a.overhead_pairs):
            for variant, cfg in (("A", cfg_a), ("B", cfg_b)):
                log(f"overhead: pair {pair + 1}/{a.overhead_pairs}, variant {variant}")
                placed = "cpu" if variant == "A" else None
                runs[variant].append(
                    self.iteration_times(cfg, f"overhead-{variant}{pair}", None, placed)
                )
        med = {v: [r["median_s"] for r in runs[v]] for v in runs}
        ratio = median(med["A"]) / median(med["B"])
        pair_ratios = [x / y for x, y in zip(med["A"], med["B"])]
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
            pair_ratios=pair_ratios,
            spread_pct=dict(A=spread_pct(med["A"]), B=spread_pct(med["B"])),
            target=f"ratio <= {RATIO_TARGET}",
            passed=ratio <= RATIO_TARGET,
        )
        if a.overhead_sim_runs:
            cfg_s = self.train_only("overhead_S_sim", data, a.overhead_sim_iters, "GCURunner")
            sim = []
            for i in range(a.overhead_sim_runs):
                log(f"overhead: GCURunner on 1 simulated card, run {i + 1}")
                sim.append(self.iteration_times(cfg_s, f"overhead-sim{i}", 1, "gcu:0"))
            sim_med = median([r["median_s"] for r in sim])
            out["simulated_card"] = dict(
                what="GCURunner on 1 simulated card (v2): GCU counterparts selected "
                "(GCUOptimWrapper, GCULogProcessor); informational, stock Runner cannot "
                "place a model on a GCU",
                iters=a.overhead_sim_iters,
                runs=sim,
                median_s=sim_med,
                vs_cpu_A=sim_med / out["median_A_s"],
            )
        return out

    # -- 2. start-up -------------------------------------------------------------------
    def import_time(self, simulate, name, ext_dir=None):
        cmd = [self.python, osp.join(HERE, "import_time.py")]
        code, wall, _, path = self.run(cmd, self.env(simulate=simulate, ext_dir=ext_dir), name)
        self.check(code, path, "import_time.py")
        result = self.last_json(path)
        result["process_s"] = wall
        return result

    def first_iteration(self, cfg, name, simulate=None):
        work = osp.join(self.root, "work", name)
        cmd = [self.python, self.train_script(), cfg, "--work-dir", work]
        code, wall, seen, path = self.run(cmd, self.env(simulate=simulate), name, FIRST_ITER)
        self.check(code, path, f"tools/train.py ({name})")
        if seen is None:
            raise RuntimeError(f"{name}: no {FIRST_ITER!r} line in {path}")
        shutil.rmtree(work, ignore_errors=True)
        return dict(first_iter_s=seen, process_s=wall)

    def section_startup(self):
        a = self.args
        out = {"sim_first_run_compiles": self.compile_run}
        variants = (("no_sim", None), ("sim8_cached", 8))
        runs = {k: [] for k, _ in variants}
        for i in range(a.import_repeats):
            for key, simulate in variants:
                log(f"startup: import mmgcu ({key}) {i + 1}/{a.import_repeats}")
                runs[key].append(self.import_time(simulate, f"import-{key}"))
        for key in runs:
            r = runs[key]
            out[f"import_{key}"] = dict(
                runs=r,
                **{
                    f"median_{f}": median([x[f] for x in r])
                    for f in ("total_s", "torch_s", "mmengine_s", "mmgcu_s", "process_s")
                },
            )
        data = self.dataset(64)
        cfg = self.train_only("launch", data, a.launch_iters)
        variants = (("cpu_no_sim", None), ("sim1_cached", 1))
        runs = {k: [] for k, _ in variants}
        for i in range(a.launch_runs):
            for key, simulate in variants:
                log(f"startup: launch to first iteration ({key}) {i + 1}/{a.launch_runs}")
                runs[key].append(self.first_iteration(cfg, f"launch-{key}{i}", simulate))
        for key in runs:
            out[f"launch_{key}"] = dict(
                runs=runs[key],
                median_first_iter_s=median([r["first_iter_s"] for r in runs[key]]),
                median_process_s=median([r["process_s"] for r in runs[key]]),
            )
        return out

    # -- 3. rehearsal ------------------------------------------------------------------
    def section_rehearsal(self):
        a = self.args
        data = self.dataset(64)
        cfg = self.config("rehearsal", data)
        runs = []
        for i in range(a.rehearsal_runs):
            log(f"rehearsal: 8 simulated cards ({a.rehearsal_api}), run {i + 1}")
            work = osp.join(self.root, "work", f"rehearsal{i}")
            cmd = ["bash", osp.join(REPO, "tools", "dist_train.sh"), cfg, "--work-dir", work]
            env = self.env(simulate=8, api=a.rehearsal_api, PYTHON=self.python)
            code, wall, _, path = self.run(cmd, env, f"rehearsal{i}")
            with open(path) as f:
                text = f.read()
            miou = re.findall(r"mIoU: ([0-9.]+)", text)
            runs.append(
                dict(
                    exit_code=code,
                    wall_s=wall,
                    miou=float(miou[-1]) if miou else None,
                    checkpoint=osp.exists(osp.join(work, "iter_4.pth")),
                )
            )
            if code == 0:
                shutil.rmtree(work, ignore_errors=True)
        wall = median([r["wall_s"] for r in runs])
        ok = all(r["exit_code"] == 0 for r in runs)
        return dict(
            what="MMGCU_SIMULATE=8 tools/dist_train.sh <tiny config> --work-dir W",
            api=a.rehearsal_api,
            runs=runs,
            median_wall_s=wall,
            all_exit_0=ok,
            target=f"< {REHEARSAL_TARGET_S:.0f} s, exit code 0",
            passed=ok and wall < REHEARSAL_TARGET_S,
        )

    # -- 4. simulator cost ---------------------------------------------------------------
    def section_simcost(self):
        a = self.args
        out = {}
        for api in a.simcost_apis:
            log(f"simcost: {api}")
            cmd = [self.python, osp.join(HERE, "simcost.py"), "--steps", str(a.simcost_steps)]
            cmd += ["--op-number", str(a.simcost_op_number), "--op-repeat", str(a.simcost_repeat)]
            code, _, _, path = self.run(cmd, self.env(simulate=1, api=api), f"simcost-{api}")
            self.check(code, path, "simcost.py")
            out[api] = self.last_json(path)
        return out


# -- machine -----------------------------------------------------------------------------
def _version(dist):
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        return None
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info(python):
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    git = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        platform=platform.platform(),
        cpu_model=cpu,
        nproc=os.cpu_count(),
        usable_cpus=usable,
        python=platform.python_version(),
        python_executable=python,
        torch=_version("torch"),
        mmengine=_version("mmengine"),
        mmcv=_version("mmcv"),
        mmsegmentation=_version("mmsegmentation"),
        git_commit=git or None,
        git_dirty=bool(dirty),
        load1_at_start=load1(),
    )


# -- the table ---------------------------------------------------------------------------
def _ms(s):
    return None if s is None else s * 1000.0


def table_rows(results):
    """(section, measurement, value, unit, target, verdict) rows, in a fixed order."""
    rows = []
    add = rows.append
    o = results.get("overhead")
    if o:
        n = len(o["run_medians_s"]["A"])
        add(
            (
                "1 overhead",
                f"iteration, stock Runner (median of {n} runs)",
                _ms(o["median_B_s"]),
                "ms",
                "",
                "",
            )
        )
        add(
            (
                "1 overhead",
                f"iteration, GCURunner (median of {n} runs)",
                _ms(o["median_A_s"]),
                "ms",
                "",
                "",
            )
        )
        add(
            (
                "1 overhead",
                "ratio GCURunner / Runner",
                o["ratio_A_over_B"],
                "x",
                f"<= {RATIO_TARGET}",
                "PASS" if o["passed"] else "FAIL",
            )
        )
        pr = o["pair_ratios"]
        add(
            (
                "1 overhead",
                "ratio per A/B pair, min..max",
                f"{min(pr):.3f}..{max(pr):.3f}",
                "x",
                "",
                "",
            )
        )
        add(
            (
                "1 overhead",
                "spread of run medians, Runner / GCURunner",
                f"{o['spread_pct']['B']:.1f} / {o['spread_pct']['A']:.1f}",
                "%",
                "",
                "",
            )
        )
        s = o.get("simulated_card")
        if s:
            add(
                (
                    "1 overhead",
                    "iteration, GCURunner on 1 simulated card (v2)",
                    _ms(s["median_s"]),
                    "ms",
                    "info",
                    "",
                )
            )
            add(("1 overhead", "simulated card / CPU GCURunner", s["vs_cpu_A"], "x", "info", ""))
    st = results.get("startup")
    if st:
        for key, label in (("no_sim", "no simulator"), ("sim8_cached", "MMGCU_SIMULATE=8, cached")):
            r = st[f"import_{key}"]
            add(
                (
                    "2 start-up",
                    f"import mmgcu, fresh interpreter ({label})",
                    r["median_total_s"],
                    "s",
                    "",
                    "",
                )
            )
            add(
                (
                    "2 start-up",
                    f"  of which mmgcu itself ({label})",
                    r["median_mmgcu_s"],
                    "s",
                    "",
                    "",
                )
            )
            add(
                ("2 start-up", f"  process wall time ({label})", r["median_process_s"], "s", "", "")
            )
        c = st.get("sim_first_run_compiles")
        if c:
            add(
                (
                    "2 start-up",
                    "import mmgcu, simulator, first run (compiles C++)",
                    c["total_s"],
                    "s",
                    "",
                    "",
                )
            )
            add(
                (
                    "2 start-up",
                    "  process wall time (first run, compiles)",
                    c["process_s"],
                    "s",
                    "",
                    "",
                )
            )
        for key, label in (
            ("cpu_no_sim", "CPU, no simulator"),
            ("sim1_cached", "1 simulated card"),
        ):
            r = st[f"launch_{key}"]
            add(
                (
                    "2 start-up",
                    f"launch to first iteration, tools/train.py ({label})",
                    r["median_first_iter_s"],
                    "s",
                    "",
                    "",
                )
            )
    r = results.get("rehearsal")
    if r:
        codes = ",".join(str(x["exit_code"]) for x in r["runs"])
        add(
            (
                "3 rehearsal",
                f"8-rank simulated run ({r['api']}), dist_train.sh, wall",
                r["median_wall_s"],
                "s",
                f"< {REHEARSAL_TARGET_S:.0f}",
                "PASS" if r["passed"] else "FAIL",
            )
        )
        add(("3 rehearsal", "exit code(s)", codes, "", "0", "PASS" if r["all_exit_0"] else "FAIL"))
    sc = results.get("simcost")
    for api, c in (sc or {}).items():
        m = c["step_median_s"]
        add(("4 simcost", f"train step (fwd+bwd+SGD), CPU [{api}]", _ms(m["cpu"]), "ms", "", ""))
        add(
            (
                "4 simcost",
                f"train step, simulated {c['card']} [{api}]",
                _ms(m["card"]),
                "ms",
                "",
                "",
            )
        )
        add(("4 simcost", f"train step, card / CPU [{api}]", m["ratio"], "x", "info", ""))
        same = c["first_loss"]["cpu"] == c["first_loss"]["card"]
        add(
            (
                "4 simcost",
                f"first-step loss equal on CPU and card [{api}]",
                "yes" if same else "no",
                "",
                "",
                "",
            )
        )
        for op, row in c["ops"].items():
            add(
                (
                    "4 simcost",
                    f"{op}: CPU / card / overhead [{api}]",
                    f"{row['cpu_us']:.1f} / {row['card_us']:.1f} / {row['overhead_us']:+.1f}",
                    "us",
                    "",
                    "",
                )
            )
    return rows


def format_table(rows):
    header = ("section", "measurement", "value", "unit", "target", "verdict")

    def cell(v):
        if v is None:
            return "n/a"
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    cells = [header] + [tuple(cell(v) for v in row) for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for n, r in enumerate(cells):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------
QUICK = dict(
    overhead_pairs=1,
    overhead_iters=12,
    overhead_warmup=3,
    overhead_sim_iters=8,
    import_repeats=1,
    launch_runs=1,
    simcost_steps=3,
    simcost_op_number=200,
    simcost_repeat=2,
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", default="bench_results/bench.json", help="JSON results file")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: smallest sizes (explicit sizes win)"
    )
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    p.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset")
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
    g = p.add_argument_group("1 overhead")
    g.add_argument("--overhead-pairs", type=int, default=5, help="A B pairs (processes x2)")
    g.add_argument("--overhead-iters", type=int, default=200, help="iterations per run")
    g.add_argument("--overhead-warmup", type=int, default=5, help="first iterations dropped")
    g.add_argument("--overhead-size", type=int, default=128, help="synthetic image side")
    g.add_argument("--overhead-sim-runs", type=int, default=1, help="simulated-card runs (0: none)")
    g.add_argument("--overhead-sim-iters", type=int, default=60, help="its iterations")
    g = p.add_argument_group("2 start-up")
    g.add_argument("--import-repeats", type=int, default=5, help="fresh interpreters per variant")
    g.add_argument("--launch-runs", type=int, default=3, help="tools/train.py runs per variant")
    g.add_argument("--launch-iters", type=int, default=2, help="iterations of those runs")
    g.add_argument("--skip-compile", action="store_true", help="do not time a fresh compile")
    g = p.add_argument_group("3 rehearsal")
    g.add_argument("--rehearsal-runs", type=int, default=1, help="8-rank runs (median)")
    g.add_argument("--rehearsal-api", default="v2", choices=("v2", "legacy"))
    g = p.add_argument_group("4 simcost")
    g.add_argument("--simcost-apis", default="v2,legacy", help="simulated APIs to measure")
    g.add_argument("--simcost-steps", type=int, default=30, help="timed train steps per device")
    g.add_argument("--simcost-op-number", type=int, default=2000, help="op calls per timing")
    g.add_argument("--simcost-repeat", type=int, default=5, help="timings per op (median)")
    args = p.parse_args(argv)
    if args.quick:
        defaults = {a.dest: a.default for a in p._actions}
        for key, value in QUICK.items():
            if getattr(args, key) == defaults[key]:  # explicit sizes win over --quick
                setattr(args, key, value)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        p.error(f"unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    args.simcost_apis = [s.strip() for s in args.simcost_apis.split(",") if s.strip()]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    info = machine_info(args.python)
    if info["load1_at_start"] and info["usable_cpus"]:
        if info["load1_at_start"] > 0.5 * info["usable_cpus"]:
            log(
                f"WARNING: load average {info['load1_at_start']:.1f} on "
                f"{info['usable_cpus']} CPUs: the machine is busy, timings will be noisy"
            )
    started = time.perf_counter()
    sections, loads, errors = {}, {}, {}
    needs_sim = set(args.sections) - {"overhead"} or args.overhead_sim_runs > 0
    try:
        if needs_sim:
            compile_now = "startup" in args.sections and not args.skip_compile
            try:
                bench.prepare_extension(measure_compile=compile_now)
            except Exception as e:  # without the simulator, only the CPU comparison runs
                log(f"extension FAILED: {e}")
                errors["extension"] = f"{type(e).__name__}: {e}"
                args.overhead_sim_runs = 0
        no_sim = "extension" in errors
        for name in SECTIONS:
            if name in args.sections and not (no_sim and name != "overhead"):
                before = load1()
                t0 = time.perf_counter()
                try:
                    sections[name] = getattr(bench, f"section_{name}")()
                except Exception as e:  # the other sections still run and are reported
                    log(f"{name} FAILED: {e}")
                    errors[name] = f"{type(e).__name__}: {e}"
                loads[name] = dict(
                    load1_before=before, load1_after=load1(), section_s=time.perf_counter() - t0
                )
    finally:
        if not args.keep:
            shutil.rmtree(bench.root, ignore_errors=True)
        else:
            log(f"scratch folder kept: {bench.root}")
    rows = table_rows(sections)
    rows += [
        (
            f"{SECTIONS.index(n) + 1} {n}" if n in SECTIONS else n,
            "ERROR (see JSON)",
            str(e).splitlines()[0][:60],
            "",
            "",
            "FAIL",
        )
        for n, e in errors.items()
    ]
    passed = all(r[5] != "FAIL" for r in rows)
    if args.quick:  # smoke sizes: a verdict is only a sign that the section ran
        rows = [r[:5] + (f"{r[5]} (quick)" if r[5] else "",) for r in rows]
    report = dict(
        schema=1,
        machine=info,
        args={k: v for k, v in vars(args).items()},
        sections=sections,
        section_load=loads,
        errors=errors,
        extension=dict(dir=bench.ext_dir, untimed_build_s=bench.prebuild_s),
        total_s=time.perf_counter() - started,
        table=[
            dict(zip(("section", "measurement", "value", "unit", "target", "verdict"), r))
            for r in rows
        ],
        passed=passed,
    )
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(
        f"\nmmgcu bench, {info['date']}, {info['cpu_model']} ({info['usable_cpus']} CPUs), "
        f"Python {info['python']}, torch {info['torch']}, load {info['load1_at_start'] or 0:.2f}"
        + (" [QUICK: smoke sizes, not a measurement]" if args.quick else "")
    )
    print(format_table(rows))
    print(f"\n{args.out} written ({report['total_s']:.0f} s)")
    if errors:
        return 1
    return 1 if args.check and not report["passed"] else 0


if __name__ == "__main__":
    sys.exit(main())
