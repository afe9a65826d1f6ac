"""Faults during training: a rank that dies or hangs ends the job fast, and is named.

Real torchrun jobs of stock mmseg ``tools/train.py`` on simulated cards. Faults are injected
by the hooks of ``programs/fault_hooks.py`` (the ranks import it from the config) or from
outside, with signals.
"""

import glob
import os
import os.path as osp
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

import mmgcu.runtime.heartbeat as hb
from mmgcu.sim.build import extensions_root
from tests.conftest import REPO, clean_env, last_json, one_node, running
from tests.e2e.conftest import (
    LEG_API,
    NO_VAL,
    PROGRAMS,
    checkpoints,
    fault_config,
    finish,
    free_port,
    mmseg_tool,
    probes,
    programs_env,
    root_cause,
    train_job,
    wait_for,
    worker_pids,
    write_config,
)

pytestmark = pytest.mark.e2e

# -- a rank that dies ends the whole job, fast, and is named -------------------------


@pytest.mark.parametrize("mode,exitcode", [("exit", 3), ("raise", 1)])
def test_a_failing_rank_ends_the_job(mode, exitcode, dataset, tmp_path):
    hooks = [dict(type="FaultHook", mode=mode, at=2, rank=2)]
    cfg = fault_config(tmp_path / "cfg.py", dataset, hooks, max_iters=50)
    work = str(tmp_path / "work")
    code, out = finish(train_job(cfg, work, 3), timeout=300)
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


@pytest.mark.t20  # the legacy path on the T20 stack too
def test_a_killed_rank_ends_the_job_before_the_collective_timeout(dataset, tmp_path):
    hooks = [dict(type="FaultHook", mode="sleep", at=1, rank=1)]
    # Collectives would wait 10 minutes: the job must end because rank 1 is gone.
    cfg = fault_config(
        tmp_path / "cfg.py", dataset, hooks, max_iters=50, env_cfg=dict(dist_cfg=dict(timeout=600))
    )
    work = str(tmp_path / "work")
    proc = train_job(cfg, work, 3)
    wait_for(osp.join(work, "fault_rank1"), proc)
    pids = worker_pids(work)
    assert sorted(pids) == [0, 1, 2]
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


# -- a rank that hangs: named, and the job ends within the watchdog's bound ----------

HANG_BOUND = 10  # env_cfg.watchdog.timeout of the job below, in seconds


def wait_for_beat(work, rank, phase, proc, timeout=60):
    """Until ``rank`` has published a heartbeat in ``phase``: beats go out once per
    watchdog interval, so a rank a few quick steps in may still show its first."""
    deadline = time.time() + timeout
    while True:
        beats = [hb.read_beats(d).get(rank) for d in glob.glob(hb.beat_dir(work, "*"))]
        if any(b and b["phase"] == phase for b in beats):
            return
        assert proc.poll() is None and time.time() < deadline, f"rank {rank} never beat {phase}"
        time.sleep(0.1)


@pytest.mark.t20  # the legacy path on the T20 stack too
def test_a_stopped_rank_is_named_and_ends_the_job(dataset, tmp_path):
    """SIGSTOP, from outside, on rank 1 of 3 in steady training (the process-group timeout
    is mmgcu's default, 30 minutes)."""
    hooks = [dict(type="FaultHook", mode="mark", at=3, rank=1)]
    cfg = fault_config(
        tmp_path / "cfg.py",
        dataset,
        hooks,
        max_iters=500,
        env_cfg=dict(watchdog=dict(timeout=HANG_BOUND, interval=1)),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1000)),  # no save
    )
    work = str(tmp_path / "work")
    proc = train_job(cfg, work, 3)
    wait_for(osp.join(work, "fault_rank1"), proc)
    wait_for_beat(work, rank=1, phase="train", proc=proc)
    pid = worker_pids(work)[1]
    try:
        os.kill(pid, signal.SIGSTOP)
        stopped = time.time()
        code, out = finish(proc, timeout=300)
        took = time.time() - stopped
    finally:
        if running(pid):
            os.kill(pid, signal.SIGKILL)
    print(f"SIGSTOP: the job ended {took:.1f} s after rank 1 was stopped (bound {HANG_BOUND} s)")

    assert code != 0, out[-4000:]
    assert took < HANG_BOUND + 30, f"the job ran on for {took:.0f} s after rank 1 was stopped"
    reports = [line for line in out.splitlines() if "mmgcu: the job is stuck" in line]
    assert len(reports) == 1, out[-4000:]
    who = f"rank 1 (host {socket.gethostname()}, pid {pid}, card 1), last heard in a train step"
    assert who in reports[0], reports[0]
    assert "the process is stopped (state T: SIGSTOP or a debugger)" in reports[0]
    assert "ranks 0, 2 wait in a train step" in reports[0]
    assert "rank 0 kills it (SIGKILL)" in reports[0]
    # torchrun's summary names the stopped rank, not a healthy one.
    assert root_cause(out) == (1, -9), out[-4000:]
    assert not any(running(p) for p in worker_pids(work).values()), "ranks left running"


# -- the collective timeout is the config's -------------------------------------------


@pytest.mark.parametrize("api", ["v2", "legacy"])
def test_dist_cfg_timeout_reaches_the_process_groups(api, dataset, tmp_path):
    cfg = write_config(tmp_path / "cfg.py", dataset)
    proc = subprocess.run(
        [sys.executable, osp.join(PROGRAMS, "spy_timeouts.py"), cfg, str(tmp_path / "work")],
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
    assert seen["torch.distributed"] == [123], seen
    if api == "legacy":  # torch_gcu 1.x: the ECCL group for card tensors, a world of its own
        assert seen["torch_gcu.distributed"] == [123], seen


# -- a parameter born in the first forward pass ---------------------------------------


@pytest.mark.t20  # the legacy path on the T20 stack too
def test_a_parameter_born_in_the_first_forward_stops_the_job(tmp_path):
    env = programs_env(MMGCU_SIMULATE=1, MMGCU_SIMULATE_API=LEG_API, OMP_NUM_THREADS=1)
    proc = subprocess.run(
        [sys.executable, osp.join(PROGRAMS, "late_parameter.py")],
        env=clean_env(WORK_DIR=tmp_path, **env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0, proc.stdout[-4000:]
    assert (
        "mmgcu: 1 parameter(s) of the model were created after it was wrapped (in its first "
        "forward pass) and are not in the optimizer: scale on cpu" in proc.stderr
    ), proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr


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
    # Given as TORCH_EXTENSIONS_DIR, so that moving HOME does not move it.
    extensions = extensions_root()
    cfg = write_config(
        tmp_path / "cfg.py", dataset, train_cfg=dict(max_iters=2, val_interval=100), **NO_VAL
    )
    packages = [osp.dirname(importlib.import_module(p).__file__) for p in PACKAGES]
    before = snapshot(packages)

    strace = ["strace", "-f", "--seccomp-bpf", "-qq", "-ff", "-y", "-s", "4096"]
    strace += ["-o", str(traces / "t"), "-e", f"trace={WRITE_SYSCALLS}"]
    launch = [sys.executable, "-m", "torch.distributed.run", *one_node()]
    launch += ["--nproc_per_node=2", mmseg_tool("train.py"), cfg, "--launcher", "pytorch"]
    launch += ["--work-dir", work]
    env = clean_env(
        MMGCU_SIMULATE=2,
        OMP_NUM_THREADS=1,
        HOME=home,
        TMPDIR=tmp,
        MMGCU_LOCK_DIR=tmp / "locks",
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
