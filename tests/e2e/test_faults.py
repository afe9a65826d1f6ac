"""Faults during training: a rank that dies takes the job down fast, checkpoints survive.

Real torchrun jobs of stock mmseg ``tools/train.py`` on simulated cards. The faults are
injected by hooks in a module written to tmp_path (the ranks import it from the config).
"""

import glob
import os
import os.path as osp
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, clean_env, last_json, run_python, running
from tests.e2e.conftest import (
    checkpoints,
    finish,
    free_port,
    mmseg_tool,
    probes,
    torchrun,
    write_config,
)

pytestmark = pytest.mark.e2e

FAULT_HOOKS = '''
import os
import signal
import time

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class FaultHook(Hook):
    """After train iteration ``at`` (1-based), rank ``rank`` (None: every rank) fails."""

    def __init__(self, mode, at, rank=None):
        self.mode, self.at, self.rank = mode, at, rank

    def before_train(self, runner):
        with open(os.path.join(runner.work_dir, f"pid_rank{runner.rank}"), "w") as f:
            f.write(str(os.getpid()))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 != self.at or self.rank not in (None, runner.rank):
            return
        with open(os.path.join(runner.work_dir, f"fault_rank{runner.rank}"), "w") as f:
            f.write(str(time.time()))
        if self.mode == "exit":
            os._exit(3)
        if self.mode == "raise":
            raise RuntimeError(f"injected fault in rank {runner.rank}")
        if self.mode == "sleep":  # until the test kills this rank
            time.sleep(900)
        if self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)


@HOOKS.register_module()
class SaveRecorderHook(Hook):
    """Records, per rank, each checkpoint save it enters and each file it writes."""

    def before_run(self, runner):
        import mmengine.runner.runner as runner_module

        log = os.path.join(runner.work_dir, f"saves_rank{runner.rank}.txt")
        write = runner_module.save_checkpoint

        def recording_write(checkpoint, filename, *args, **kwargs):
            with open(log, "a") as f:
                f.write(f"write {os.path.basename(filename)}\\n")
            return write(checkpoint, filename, *args, **kwargs)

        runner_module.save_checkpoint = recording_write
        self.log = log

    def before_save_checkpoint(self, runner, checkpoint):
        with open(self.log, "a") as f:
            f.write(f"save iter {checkpoint['meta']['iter']}\\n")
'''

HOOK_IMPORTS = dict(imports=["mmgcu", "tests.e2e.probe", "fault_hooks"], allow_failed_imports=False)
# No validation: the faults are in training, and validation costs time.
NO_VAL = dict(val_cfg=None, val_dataloader=None, val_evaluator=None)


def fault_config(tmp_path, dataset, name, hooks, max_iters=4, **overrides):
    with open(tmp_path / "fault_hooks.py", "w") as f:
        f.write(FAULT_HOOKS)
    return write_config(
        tmp_path / name,
        dataset,
        custom_imports=HOOK_IMPORTS,
        custom_hooks=[dict(type="ProbeHook"), *hooks],
        train_cfg=dict(max_iters=max_iters, val_interval=100),
        **NO_VAL,
        **overrides,
    )


def hook_env(tmp_path):
    return dict(PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}")


def train(cfg, work, nproc, tmp_path, *extra):
    args = [mmseg_tool("train.py"), cfg, "--launcher", "pytorch", "--work-dir", work, *extra]
    return torchrun(args, nproc=nproc, cards=nproc, extra_env=hook_env(tmp_path))


def root_cause(out):
    """``(rank, exitcode)`` of the "Root Cause" in torchrun's failure summary."""
    entry = re.search(
        r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+) \(local_rank: \d+\)"
        r"\s*\n\s*exitcode\s*:\s*(-?\d+)",
        out,
        re.S,
    )
    return entry and (int(entry.group(1)), int(entry.group(2)))


def worker_pids(work):
    pids = {}
    for path in glob.glob(osp.join(work, "pid_rank*")):
        with open(path) as f:
            pids[int(path.rsplit("rank", 1)[1])] = int(f.read())
    return pids


# -- a rank that dies ends the whole job, fast, and is named -------------------------


@pytest.mark.parametrize("mode,exitcode", [("exit", 3), ("raise", 1)])
def test_a_failing_rank_ends_the_job(mode, exitcode, dataset, tmp_path):
    hooks = [dict(type="FaultHook", mode=mode, at=2, rank=2)]
    cfg = fault_config(tmp_path, dataset, "cfg.py", hooks, max_iters=50)
    work = str(tmp_path / "work")
    code, out = finish(train(cfg, work, 4, tmp_path), timeout=300)
    ended = time.time()

    assert code != 0, out[-4000:]
    with open(osp.join(work, "fault_rank2")) as f:
        took = ended - float(f.read())
    print(f"{mode}: job ended {took:.1f} s after rank 2 failed")
    assert took < 60, f"the job ran on for {took:.0f} s after rank 2 failed"
    assert root_cause(out) == (2, exitcode), out[-4000:]
    if mode == "raise":
        assert "[rank2]: RuntimeError: injected fault in rank 2" in out
        # The others' collectives lost rank 2: they say so and let rank 2 be reported.
        assert "a collective failed because another rank stopped" in out
    assert not probes(work), "a rank finished training without rank 2"
    assert not any(running(pid) for pid in worker_pids(work).values())


def test_a_killed_rank_ends_the_job_before_the_collective_timeout(dataset, tmp_path):
    hooks = [dict(type="FaultHook", mode="sleep", at=1, rank=1)]
    # Collectives would wait 10 minutes: the job must end because rank 1 is gone.
    cfg = fault_config(
        tmp_path, dataset, "cfg.py", hooks, max_iters=50, env_cfg=dict(dist_cfg=dict(timeout=600))
    )
    work = str(tmp_path / "work")
    proc = train(cfg, work, 4, tmp_path)
    deadline = time.time() + 240
    while not osp.exists(osp.join(work, "fault_rank1")):
        assert proc.poll() is None and time.time() < deadline, "rank 1 never reached iter 1"
        time.sleep(0.5)
    pids = worker_pids(work)
    assert sorted(pids) == [0, 1, 2, 3]
    os.kill(pids[1], signal.SIGKILL)
    killed = time.time()
    code, out = finish(proc, timeout=300)
    took = time.time() - killed
    print(f"job ended {took:.1f} s after rank 1 was killed")

    assert code != 0
    assert took < 60, f"the job ran on for {took:.0f} s after rank 1 was killed"
    assert root_cause(out) == (1, -9), out[-4000:]
    assert "Signal 9 (SIGKILL) received by PID" in out
    assert [r for r, pid in pids.items() if running(pid)] == [], "ranks left running"


# -- the collective timeout is the config's -------------------------------------------

SPY_TIMEOUTS = """
import json, sys
import torch.distributed as dist

seen = {"init_process_group": [], "new_group": []}  # the timeout of each call
for name in seen:
    def spy(*args, _real=getattr(dist, name), _name=name, **kwargs):
        timeout = kwargs.get("timeout")
        seen[_name].append(timeout.total_seconds() if timeout is not None else None)
        return _real(*args, **kwargs)
    setattr(dist, name, spy)

from mmengine.config import Config
from mmseg.registry import RUNNERS

cfg = Config.fromfile(sys.argv[1])
cfg.merge_from_dict({"env_cfg.dist_cfg.timeout": 123})  # what --cfg-options does
cfg.launcher, cfg.work_dir = "pytorch", sys.argv[2]
RUNNERS.build(cfg)
print(json.dumps(seen))
"""


@pytest.mark.parametrize("api", ["v2", "legacy"])
def test_dist_cfg_timeout_reaches_the_process_groups(api, dataset, tmp_path):
    cfg = write_config(tmp_path / "cfg.py", dataset)
    proc = subprocess.run(
        [sys.executable, "-c", SPY_TIMEOUTS, cfg, str(tmp_path / "work")],
        env=clean_env(
            MMGCU_SIMULATE=1,
            MMGCU_SIMULATE_API=api,
            RANK=0,
            LOCAL_RANK=0,
            WORLD_SIZE=1,
            LOCAL_WORLD_SIZE=1,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=free_port(),
            OMP_NUM_THREADS=1,
        ),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = last_json(proc.stdout)
    assert seen["init_process_group"] == [123]
    if api == "legacy":  # the ECCL group for card tensors gets the same timeout
        assert 123 in seen["new_group"], seen


# -- killed between checkpoints: resume continues from the last complete one ----------


@pytest.fixture(scope="module")
def killed_and_resumed(dataset, tmp_path_factory):
    """Two ranks, checkpoints every 2 iterations; killed at iteration 3, then resumed."""
    tmp_path = tmp_path_factory.mktemp("resume")
    work = str(tmp_path / "work")
    checkpoint = dict(checkpoint=dict(type="CheckpointHook", interval=2, by_epoch=False))
    record = dict(type="SaveRecorderHook")
    killed_cfg = fault_config(
        tmp_path,
        dataset,
        "killed.py",
        [record, dict(type="FaultHook", mode="kill", at=3)],
        max_iters=6,
        default_hooks=checkpoint,
    )
    resume_cfg = fault_config(
        tmp_path, dataset, "resume.py", [record], max_iters=6, default_hooks=checkpoint
    )
    killed_code, killed_out = finish(train(killed_cfg, work, 2, tmp_path), timeout=300)
    after_kill = sorted(os.listdir(work))
    with open(osp.join(work, "last_checkpoint")) as f:
        last_after_kill = f.read()
    code, out = finish(train(resume_cfg, work, 2, tmp_path, "--resume"), timeout=300)
    return dict(
        work=work,
        killed_code=killed_code,
        killed_out=killed_out,
        after_kill=after_kill,
        last_after_kill=last_after_kill,
        code=code,
        out=out,
    )


def test_resume_after_a_kill_continues_from_the_last_checkpoint(killed_and_resumed):
    run = killed_and_resumed
    assert run["killed_code"] != 0
    assert root_cause(run["killed_out"]) in [(0, -9), (1, -9)], run["killed_out"][-4000:]
    # Killed after iteration 3 ran, before it was logged or checkpointed.
    assert "Iter(train) [2/6]" in run["killed_out"]
    assert "Iter(train) [3/6]" not in run["killed_out"]
    assert {"fault_rank0", "fault_rank1"} & set(run["after_kill"])

    assert run["code"] == 0, run["out"][-4000:]
    assert "resumed epoch: 0, iter: 2" in run["out"]
    assert "Iter(train) [3/6]" in run["out"] and "Iter(train) [1/6]" not in run["out"]
    assert checkpoints(run["work"]) == ["iter_2.pth", "iter_4.pth", "iter_6.pth"]
    assert {r["iter"] for r in probes(run["work"]).values()} == {6}


def test_a_killed_run_leaves_only_complete_checkpoints(killed_and_resumed):
    import torch

    run = killed_and_resumed
    names = run["after_kill"]
    assert [n for n in names if n.endswith(".pth")] == ["iter_2.pth"], names
    assert not [n for n in names if "partial" in n], names
    assert run["last_after_kill"].endswith("iter_2.pth")
    for name in checkpoints(run["work"]):
        ckpt = torch.load(osp.join(run["work"], name), map_location="cpu", weights_only=False)
        assert ckpt["meta"]["iter"] == int(name[len("iter_") : -len(".pth")])
        assert ckpt["state_dict"] and ckpt["optimizer"]


def test_only_rank_0_writes_checkpoints(killed_and_resumed):
    """Every rank's CheckpointHook asks; GCURunner.save_checkpoint lets rank 0 alone save."""
    work = killed_and_resumed["work"]
    assert not osp.exists(osp.join(work, "saves_rank1.txt")), "rank 1 saved a checkpoint"
    with open(osp.join(work, "saves_rank0.txt")) as f:
        saves = f.read().split("\n")
    assert saves[:-1] == [
        "save iter 2",
        "write .iter_2.pth.partial",
        "save iter 4",
        "write .iter_4.pth.partial",
        "save iter 6",
        "write .iter_6.pth.partial",
    ]


# -- a write that fails half-way leaves no checkpoint under the final name ------------

HALF_WRITE = """
import json, os
import torch
import mmgcu
import mmengine.runner.runner as runner_module
from mmengine.model import BaseModel

class Net(BaseModel):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)

    def forward(self, x, mode="loss"):
        return dict(loss=self.fc(x).sum())

write = runner_module.save_checkpoint
calls = []

def fails_on_second_save(checkpoint, filename, *args, **kwargs):
    calls.append(os.path.basename(filename))
    if len(calls) == 2:  # half a file, then the disk fills up
        with open(filename, "wb") as f:
            f.write(b"PK\\x03\\x04 half a checkpoint")
        raise OSError(28, "No space left on device")
    return write(checkpoint, filename, *args, **kwargs)

runner_module.save_checkpoint = fails_on_second_save
work = os.environ["WORK_DIR"]
runner = mmgcu.GCURunner(
    model=Net(),
    work_dir=work,
    train_dataloader=dict(
        dataset=[dict(x=torch.ones(2))] * 8,
        sampler=dict(type="DefaultSampler", shuffle=False),
        collate_fn=dict(type="default_collate"),
        batch_size=2,
    ),
    optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
    train_cfg=dict(by_epoch=False, max_iters=4),
    default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1, by_epoch=False)),
)
try:
    runner.train()
    error = None
except OSError as e:
    error = str(e)
with open(os.path.join(work, "last_checkpoint")) as f:
    last = f.read()
print(json.dumps(dict(calls=calls, error=error, files=sorted(os.listdir(work)), last=last)))
"""


def test_a_failed_write_keeps_the_final_name_and_last_checkpoint(tmp_path):
    import torch

    proc = run_python(HALF_WRITE, timeout=300, WORK_DIR=tmp_path)
    result = last_json(proc.stdout)
    assert result["error"] == "[Errno 28] No space left on device"
    assert result["calls"] == [".iter_1.pth.partial", ".iter_2.pth.partial"]
    assert "iter_1.pth" in result["files"] and "iter_2.pth" not in result["files"]
    assert ".iter_2.pth.partial" not in result["files"]  # the half-written file is removed
    assert result["last"].endswith("iter_1.pth")
    ckpt = torch.load(tmp_path / "iter_1.pth", map_location="cpu", weights_only=False)
    assert ckpt["meta"]["iter"] == 1


# -- nothing outside the job is touched -----------------------------------------------

PACKAGES = ("mmengine", "mmcv", "mmseg", "torch")
WRITE_SYSCALLS = (
    "openat,creat,mkdir,mkdirat,rename,renameat,renameat2,unlink,unlinkat,rmdir,"
    "link,linkat,symlink,symlinkat,truncate,chmod,fchmodat,utimensat,chdir"
)
CALL = re.compile(r"^(?P<name>\w+)\((?P<args>.*)\)\s+= (?P<ret>-?\d+)")
# A path argument, after its directory fd where there is one; strace -y prints an fd as
# 3</its/path>, and AT_FDCWD as AT_FDCWD</the/cwd>.
PATH_ARG = re.compile(r'(?:(?P<fd>AT_FDCWD|\d+)<(?P<dir>[^>]*)>, )?"(?P<path>(?:[^"\\]|\\.)*)"')
OPEN_FOR_WRITE = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND")


def written_paths(trace_dir):
    """Every path a traced process created, wrote, renamed, removed or re-moded."""
    paths = set()
    for trace in glob.glob(osp.join(trace_dir, "*")):
        cwd = None
        with open(trace, errors="replace") as f:
            for line in f:
                m = CALL.match(line)
                if not m or m["ret"].startswith("-"):
                    continue
                name, args = m["name"], m["args"]
                if name in ("openat", "open") and not any(o in args for o in OPEN_FOR_WRITE):
                    continue
                found = list(PATH_ARG.finditer(args))
                if name in ("symlink", "symlinkat"):  # the target is not written
                    found = found[-1:]
                for arg in found:
                    if arg["fd"] == "AT_FDCWD":
                        cwd = arg["dir"]
                    path = arg["path"]
                    if not osp.isabs(path):
                        path = osp.join(arg["dir"] or cwd or "<unknown cwd>", path)
                    if name == "chdir":
                        cwd = path
                    else:
                        paths.add(osp.normpath(path))
    return paths


def snapshot(roots):
    """(mtime, size) of every file under ``roots``; bytecode caches are left out.

    Any interpreter on this machine may write a missing .pyc; the job here runs with
    PYTHONDONTWRITEBYTECODE, and its own writes are traced besides.
    """
    files = {}
    for root in roots:
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in names:
                st = os.lstat(osp.join(folder, name))
                files[osp.join(folder, name)] = (st.st_mtime_ns, st.st_size)
    return files


def extensions_dir():
    """Where torch keeps this interpreter's JIT extensions (cpp_extension's own rule).

    The run below gets it as TORCH_EXTENSIONS_DIR, so that moving HOME does not move it.
    """
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return os.environ["TORCH_EXTENSIONS_DIR"]
    if torch.version.hip is not None:
        accelerator = "rocm" + torch.version.hip.replace(".", "")
    elif torch.version.cuda is not None:
        accelerator = "cu" + torch.version.cuda.replace(".", "")
    else:
        accelerator = "cpu"
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return osp.join(get_default_build_root(), f"{python}_{accelerator}")


def test_a_run_writes_only_its_work_dir_tmp_and_the_extension_cache(dataset, tmp_path):
    import importlib

    if not shutil.which("strace"):
        pytest.skip("strace is not installed")
    if subprocess.run(["strace", "-f", "-o", os.devnull, "true"]).returncode != 0:
        pytest.skip("strace cannot trace here (ptrace not permitted)")
    home, tmp, cwd, traces = (tmp_path / d for d in ("home", "tmp", "cwd", "trace"))
    for d in (home, tmp, cwd, traces):
        d.mkdir()
    work = str(tmp_path / "work")
    extensions = extensions_dir()
    cfg = write_config(
        tmp_path / "cfg.py", dataset, train_cfg=dict(max_iters=2, val_interval=100), **NO_VAL
    )
    packages = [osp.dirname(importlib.import_module(p).__file__) for p in PACKAGES]
    before = snapshot(packages)

    strace = ["strace", "-f", "--seccomp-bpf", "-qq", "-ff", "-y", "-s", "4096"]
    strace += ["-o", str(traces / "t"), "-e", f"trace={WRITE_SYSCALLS}"]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launch += ["--nproc_per_node=2", mmseg_tool("train.py"), cfg, "--launcher", "pytorch"]
    launch += ["--work-dir", work]
    env = clean_env(
        MMGCU_SIMULATE=2,
        OMP_NUM_THREADS=1,
        HOME=home,
        TMPDIR=tmp,
        TORCH_EXTENSIONS_DIR=extensions,
        PYTHONDONTWRITEBYTECODE=1,
    )
    proc = subprocess.run(
        strace + launch, env=env, cwd=cwd, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert checkpoints(work) == ["iter_2.pth"]

    # Caches that stock mmengine/mmseg keep in HOME, with or without mmgcu: yapf's
    # grammar (Config.pretty_text) and matplotlib's font list (the visualizer).
    stock_caches = [home / ".cache" / "YAPF", home / ".cache" / "matplotlib"]
    stock_caches += [home / ".config" / "matplotlib"]
    allowed = [work, str(tmp), extensions, "/dev", "/proc", *map(str, stock_caches)]

    def inside(path, root):
        return path == root or path.startswith(root.rstrip("/") + "/")

    outside = sorted(
        p
        for p in written_paths(traces)
        if not any(inside(p, root) for root in allowed)
        and not any(inside(str(cache), p) for cache in stock_caches)  # mkdir ~/.cache
    )
    assert not outside, "written outside the job's own places:\n" + "\n".join(outside)
    assert not os.listdir(cwd), "files in the launch directory"
    assert snapshot(packages) == before, "installed packages changed"


def test_the_trace_reader_sees_writes_and_skips_reads(tmp_path):
    trace = tmp_path / "t.1"
    trace.write_text(
        'openat(AT_FDCWD</job>, "/usr/lib/x.so", O_RDONLY|O_CLOEXEC) = 3</usr/lib/x.so>\n'
        'openat(AT_FDCWD</job>, "out.txt", O_WRONLY|O_CREAT|O_TRUNC, 0666) = 3</job/out.txt>\n'
        'mkdir("/home/u/.cache", 0777) = 0\n'
        'unlinkat(5</tmp/t>, "gone.py", 0) = 0\n'
        'rename("/w/.a.partial", "/w/a") = 0\n'
        'openat(AT_FDCWD</job>, "/etc/x", O_WRONLY|O_CREAT, 0666) = -1 EACCES (Permission)\n'
    )
    assert written_paths(tmp_path) == {
        "/job/out.txt",
        "/home/u/.cache",
        "/tmp/t/gone.py",
        "/w/.a.partial",
        "/w/a",
    }
