"""Helpers for the launch scripts in tools/: run one as a user would, from another folder."""

import os
import subprocess
import sys

from tests.conftest import REPO, clean_env

TOOLS = os.path.join(REPO, "tools")
#: Stand-ins for python, srun and efsmi that the launch tests put in the scripts' way.
PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")

# What a user's shell might carry into the scripts; each test sets what it means to.
LAUNCH_VARS = (
    "NNODES",
    "NODE_RANK",
    "PORT",
    "PYTHON",
    "PYTHONPATH",
    "REAL_PYTHON",
    "TRAIN_SCRIPT",
    "TEST_SCRIPT",
    "CARDS",
    "CARDS_PER_NODE",
    "CPUS_PER_TASK",
    "SRUN_ARGS",
    "GRES",
)


def script_env(**extra):
    """A clean environment without PYTHONPATH: the scripts must add the checkout themselves."""
    env = clean_env()
    for name in LAUNCH_VARS:
        env.pop(name, None)
    env["PYTHON"] = sys.executable
    env["OMP_NUM_THREADS"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_script(name, *args, cwd, timeout=300, **env):
    """Run tools/NAME with ``args``; return (exit code, stdout + stderr)."""
    proc = subprocess.run(
        [os.path.join(TOOLS, name), *map(str, args)],
        env=script_env(**env),
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout + proc.stderr
