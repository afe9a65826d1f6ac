"""bench.py's harness: child processes and their environments, inputs (datasets, configs,
the baseline checkout), timing helpers and the machine's description.

Every child gets ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` = ``--threads``, a PYTHONPATH that
starts with the checkout it runs (this one, or the baseline's), and its own extension cache
(``TORCH_EXTENSIONS_DIR``), so other checkouts sharing ``~/.cache/torch_extensions`` cannot
trigger a rebuild mid-run. Its stdout and stderr go to ``<scratch>/logs/<n>-<name>.log``.
"""

import datetime
import importlib.util
import json
import os
import os.path as osp
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
HERE = osp.dirname(osp.abspath(__file__))
TINY_REL = osp.join("configs", "tiny", "fcn_r18-tiny_8xgcu_synthetic-64x64.py")
TINY = osp.join(REPO, TINY_REL)
FIRST_ITER = "Iter(train) ["
# Variables that would change what a child runs (a launcher's, the simulator's, a card list).
DROPPED_ENV = ("MMGCU_", "TOPS_", "LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC_")
#: The simulated APIs' other names (the baseline commit's, and MMGCU_SIMULATE_API's aliases).
API_ALIASES = {"v2": "gcu2", "legacy": "gcu1"}


# -- small helpers -------------------------------------------------------------------------
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


def api_name(name: str) -> str:
    """The simulator's API name for ``name`` (``v2`` -> ``gcu2``, ``legacy`` -> ``gcu1``)."""
    return API_ALIASES.get(name, name)


def split_list(text: str):
    return [s.strip() for s in text.split(",") if s.strip()]


def _children_cpu_s():
    """User + sys seconds of this process's waited-for descendants (torchrun waits for its
    ranks, so a launch counts all of them): less sensitive than wall time to other users'
    load on a shared machine."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _stop(proc, expired) -> None:
    """Past the limit: SIGTERM (torchrun stops its own workers), SIGKILL 30 s later. Only
    the child this bench started is signalled."""
    expired.set()
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _copy_output(proc, out, marker, start):
    """Copy the child's output to ``out``; return (exit code, s until ``marker`` or None)."""
    seen = None
    try:
        for line in proc.stdout:
            if seen is None and marker is not None and marker in line:
                seen = time.perf_counter() - start
            out.write(line)
        return proc.wait(), seen
    except BaseException:
        proc.kill()
        proc.wait()
        raise


class Harness:
    """Runs the children; holds the scratch folder, the extension cache and the datasets."""

    def __init__(self, args):
        self.args = args
        self.python = args.python
        self.root = args.workdir or tempfile.mkdtemp(prefix="mmgcu-bench-")
        os.makedirs(self.root, exist_ok=True)
        self.ext_dir = args.ext_dir or osp.join(self.root, "torch_extensions")
        self.compile_run = None
        self.prebuild_s = None
        self.counter = 0
        self._counting = threading.Lock()  # run() may be called from two threads at once
        # user + sys s of the last run() and all its descendants (of every child waited for
        # meanwhile: wrong while another thread's run() ends, so only sequential runs read it)
        self.last_cpu_s = None
        self._datasets = {}
        self._baselines = {}

    # -- environment and processes -------------------------------------------------------
    def env(self, simulate=None, api="gcu2", ext_dir=None, tree=REPO, paths=(), **extra):
        """The environment of a child running the checkout ``tree`` (``paths`` after it)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED_ENV)}
        front = [tree] + list(paths) + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        env["PYTHONPATH"] = os.pathsep.join(front)
        env["PYTHONUNBUFFERED"] = "1"
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.args.threads)
        env["TORCH_EXTENSIONS_DIR"] = ext_dir or self.ext_dir
        if simulate:
            env["MMGCU_SIMULATE"] = str(simulate)
            env["MMGCU_SIMULATE_API"] = api
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def run(self, cmd, env, name, marker=None, timeout=None, cwd=REPO):
        """Run ``cmd``; return (exit code, wall s, s until ``marker`` was printed, log path)."""
        with self._counting:
            self.counter += 1
            number = self.counter
        os.makedirs(osp.join(self.root, "logs"), exist_ok=True)
        path = osp.join(self.root, "logs", f"{number:03d}-{name}.log")
        limit = timeout or self.args.timeout
        cpu = _children_cpu_s()
        start = time.perf_counter()
        with open(path, "w") as out:
            proc = subprocess.Popen(
                cmd,
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
            expired = threading.Event()
            timer = threading.Timer(limit, _stop, (proc, expired))
            timer.start()
            try:
                code, seen = _copy_output(proc, out, marker, start)
            finally:
                timer.cancel()
        wall = time.perf_counter() - start
        self.last_cpu_s = _children_cpu_s() - cpu
        if expired.is_set():
            raise RuntimeError(f"{name} ran past {limit:.0f} s; log {path}")
        return code, wall, seen, path

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

    def work_dir(self, name):
        return osp.join(self.root, "work", name)

    # -- inputs ----------------------------------------------------------------------------
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

    def write_config(self, name, lines):
        path = osp.join(self.root, "configs", f"{name}.py")
        os.makedirs(osp.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def config(self, name, data_root, lines=(), base=TINY):
        """A config inheriting ``base`` (the tiny config) on ``data_root``, plus ``lines``."""
        head = [
            f"_base_ = [{base!r}]",
            f"data_root = {data_root!r}",
            "train_dataloader = dict(dataset=dict(data_root=data_root))",
            "val_dataloader = dict(dataset=dict(data_root=data_root))",
            "test_dataloader = val_dataloader",
        ]
        return self.write_config(name, head + list(lines))

    def train_only(self, name, data_root, iters, runner="GCURunner", device="auto"):
        """A training-only job: no validation, no checkpoint, every iteration logged.
        ``runner``: ``GCURunner``, stock ``Runner`` or ``StockRunnerOnCard``
        (``stock_on_card.py``: stock logging and wrappers on simulated card 0)."""
        processor = "GCULogProcessor" if runner == "GCURunner" else "LogProcessor"
        lines = train_only_lines(iters, log_interval=1) + [
            # window_size=1: the logged 'time' is this iteration's, not a 10-iter mean
            f"log_processor = dict(type={processor!r}, by_epoch=False, window_size=1)",
            f"runner_type = {runner!r}",
            f"env_cfg = dict(device={device!r})",
            "randomness = dict(seed=0)",
        ]
        if runner == "StockRunnerOnCard":
            lines.append("custom_imports = dict(imports=['mmgcu', 'stock_on_card'])")
        return self.config(name, data_root, lines)

    def train_script(self):
        spec = importlib.util.find_spec("mmseg")
        if spec is None or spec.origin is None:
            raise RuntimeError("mmseg is not importable by this interpreter")
        return osp.join(osp.dirname(spec.origin), ".mim", "tools", "train.py")

    # -- the simulator's C++ part, and which mmgcu a child imports -------------------------
    def import_time(self, simulate, name, ext_dir=None, tree=REPO, api="gcu2"):
        """``import_time.py`` in a fresh interpreter; checks it imported ``tree``'s mmgcu."""
        cmd = [self.python, osp.join(HERE, "import_time.py")]
        env = self.env(simulate=simulate, api=api, ext_dir=ext_dir, tree=tree)
        code, wall, _, path = self.run(cmd, env, name, cwd=tree)
        self.check(code, path, "import_time.py")
        result = self.last_json(path)
        if not result["mmgcu_file"].startswith(osp.join(tree, "")):
            raise RuntimeError(f"{name} imported {result['mmgcu_file']}, not {tree}'s mmgcu")
        result["process_s"] = wall
        return result

    def build_extension(self, tree=REPO, api="gcu2", name="ext-build"):
        """Build ``tree``'s simulator extension in the cache (untimed); return the wall s."""
        cmd = [self.python, "-m", "mmgcu.sim.build"]
        env = self.env(simulate=1, api=api, tree=tree)
        code, wall, _, path = self.run(cmd, env, name, cwd=tree)
        self.check(code, path, f"python -m mmgcu.sim.build ({tree})")
        return wall

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
        self.prebuild_s = self.build_extension()

    def baseline(self, commit, api="gcu1"):
        """A throwaway ``git worktree`` of ``commit`` in the scratch folder, its extension
        built and its mmgcu checked importable; returns dict(tree, commit, api)."""
        if commit in self._baselines:
            return self._baselines[commit]
        tree = osp.join(self.root, f"baseline-{commit}")
        log(f"baseline: git worktree of {commit} in {tree}, then its extension (untimed)")
        git = ["git", "-C", REPO, "worktree", "add", "--detach", tree, commit]
        code, _, _, path = self.run(git, self.env(), f"baseline-{commit}")
        self.check(code, path, "git worktree add")
        full = subprocess.run(
            ["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        info = dict(tree=tree, commit=full, api=api, build_s=None)
        self._baselines[commit] = info
        info["build_s"] = self.build_extension(tree, api, f"baseline-ext-{commit}")
        self.import_time(1, f"baseline-import-{commit}", tree=tree, api=api)
        return info

    def cleanup(self, keep):
        """Remove the baseline worktrees (always: they are registered in the repository),
        then the scratch folder unless ``keep``."""
        for info in self._baselines.values():
            cmd = ["git", "-C", REPO, "worktree", "remove", "--force", info["tree"]]
            subprocess.run(cmd, capture_output=True)
        if keep:
            log(f"scratch folder kept: {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def train_only_lines(iters, log_interval):
    """Config lines of a training-only job: no validation, no checkpoint."""
    return [
        "val_dataloader = None",
        "val_cfg = None",
        "val_evaluator = None",
        "test_dataloader = None",
        "test_cfg = None",
        "test_evaluator = None",
        f"train_cfg = dict(type='IterBasedTrainLoop', max_iters={iters}, val_interval={iters + 1})",
        "param_scheduler = [dict(type='PolyLR', eta_min=1e-4, power=0.9, begin=0, "
        f"end={iters}, by_epoch=False)]",
        f"default_hooks = dict(logger=dict(interval={log_interval}), "
        f"checkpoint=dict(interval={iters + 1}, save_last=False))",
    ]


# -- the machine ---------------------------------------------------------------------------
def _version(dist):
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        return None
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _git(*args):
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def usable_cpus():
    """The CPUs this process may run on (all of them where the OS cannot say)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count()


def machine_info(python):
    usable = usable_cpus()
    return dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        platform=platform.platform(),
        cpu_model=_cpu_model(),
        nproc=os.cpu_count(),
        usable_cpus=usable,
        python=platform.python_version(),
        python_executable=python,
        torch=_version("torch"),
        mmengine=_version("mmengine"),
        mmcv=_version("mmcv"),
        mmsegmentation=_version("mmsegmentation"),
        git_commit=_git("rev-parse", "HEAD") or None,
        git_dirty=bool(_git("status", "--porcelain", "--untracked-files=no")),
        repo=REPO,
        load1_at_start=load1(),
    )
