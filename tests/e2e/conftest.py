"""Helpers for the multi-process runs: real torchrun, stock mmseg tools, simulated cards."""

import glob
import json
import os
import os.path as osp
import re
import subprocess
import sys
import time

import torch

from tests.conftest import REPO, clean_env, free_port, one_node  # noqa: F401 (re-exported)

TINY = osp.join(REPO, "configs", "tiny", "fcn_r18-tiny_8xgcu_synthetic-64x64.py")

#: The torch_gcu generation the end-to-end runs of this leg simulate: the T20 stack
#: (Python 3.8, torch 1.10) runs torch_gcu 1.x; the main leg (torch 2.x) runs 2.x,
#: which exists only for torch 2.x.
LEG_API = "gcu1" if torch.__version__.startswith("1.") else "gcu2"
DEVICE_TYPE = {"gcu1": "xla", "gcu2": "gcu"}
LEG_DEVICE = DEVICE_TYPE[LEG_API]


def mmseg_tool(name: str) -> str:
    """The stock script shipped in the mmseg wheel (mmseg/.mim/tools/NAME)."""
    import mmseg

    path = osp.join(osp.dirname(mmseg.__file__), ".mim", "tools", name)
    assert osp.exists(path), path
    return path


def write_config(path, dataset_root, base=TINY, **overrides) -> str:
    """A config inheriting ``base`` on ``dataset_root``, with the probe hook added."""
    lines = [
        f"_base_ = [{base!r}]",
        f"data_root = {dataset_root!r}",
        "train_dataloader = dict(dataset=dict(data_root=data_root))",
        "val_dataloader = dict(dataset=dict(data_root=data_root))",
        "test_dataloader = val_dataloader",
        "custom_imports = dict(imports=['mmgcu', 'tests.e2e.probe'], allow_failed_imports=False)",
        "custom_hooks = [dict(type='ProbeHook')]",
    ]
    lines += [f"{k} = {v!r}" for k, v in overrides.items()]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


def torchrun(
    args,
    nproc,
    cards,
    api=LEG_API,
    timeout=600,
    extra_env=None,
    nnodes=None,
    node_rank=None,
    port=None,
):
    """Start ``torchrun`` over stock tools/train.py-style args; return the Popen."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    if nnodes is None:
        cmd += one_node()
    else:
        cmd += [
            f"--nnodes={nnodes}",
            f"--node_rank={node_rank}",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
        ]
    env = clean_env(
        MMGCU_SIMULATE=cards, MMGCU_SIMULATE_API=api, OMP_NUM_THREADS=1, **(extra_env or {})
    )
    return subprocess.Popen(
        cmd + list(args),
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc, timeout=600):
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def probes(work_dir):
    reports = {}
    for path in glob.glob(osp.join(work_dir, "probe_rank*.json")):
        with open(path) as f:
            r = json.load(f)
        reports[r["rank"]] = r
    return reports


def checkpoint_report(path):
    """What a checkpoint holds, as plain torch sees it in a process without mmgcu or the
    simulator (``programs/check_cpu_checkpoint.py``)."""
    program = osp.join(osp.dirname(osp.abspath(__file__)), "programs", "check_cpu_checkpoint.py")
    proc = subprocess.run(
        [sys.executable, program, path], env=clean_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def checkpoints(work_dir):
    return sorted(osp.basename(p) for p in glob.glob(osp.join(work_dir, "*.pth")))


# -- fault tests: jobs whose config imports tests/e2e/programs/fault_hooks.py ------------

PROGRAMS = osp.join(osp.dirname(osp.abspath(__file__)), "programs")
FAULT_IMPORTS = dict(
    imports=["mmgcu", "tests.e2e.probe", "fault_hooks"], allow_failed_imports=False
)
# No validation: the faults are in training, and validation costs time.
NO_VAL = dict(val_cfg=None, val_dataloader=None, val_evaluator=None)


def fault_config(path, dataset, hooks, max_iters=4, **overrides):
    """A config whose ranks run the fault hooks ``hooks`` (and the probe)."""
    return write_config(
        path,
        dataset,
        custom_imports=FAULT_IMPORTS,
        custom_hooks=[dict(type="ProbeHook"), *hooks],
        train_cfg=dict(max_iters=max_iters, val_interval=100),
        **NO_VAL,
        **overrides,
    )


def programs_env(**extra):
    """Environment additions for processes that import the programs' modules."""
    return dict(PYTHONPATH=f"{REPO}{os.pathsep}{PROGRAMS}", **extra)


def train_job(cfg, work, nproc, *extra, cards=None, env=None):
    """torchrun of stock tools/train.py over ``cfg`` on ``nproc`` ranks; return the Popen."""
    args = [mmseg_tool("train.py"), cfg, "--launcher", "pytorch", "--work-dir", work, *extra]
    return torchrun(args, nproc=nproc, cards=cards or nproc, extra_env=programs_env(**(env or {})))


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
    """``{rank: pid}`` the fault hooks wrote before training."""
    pids = {}
    for path in glob.glob(osp.join(work, "pid_rank*")):
        with open(path) as f:
            pids[int(path.rsplit("rank", 1)[1])] = int(f.read())
    return pids


def wait_for(path, proc, timeout=240):
    """Wait until ``path`` exists while ``proc`` runs; return the time it says (or now)."""
    deadline = time.time() + timeout
    while not osp.exists(path):
        assert proc.poll() is None, f"the job ended before {osp.basename(path)}"
        assert time.time() < deadline, f"no {osp.basename(path)} after {timeout} s"
        time.sleep(0.2)
    time.sleep(0.05)  # the writer's few bytes
    with open(path) as f:
        text = f.read().strip()
    return float(text) if text else time.time()
