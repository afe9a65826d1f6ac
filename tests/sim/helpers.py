"""Run the programs of ``tests/sim/programs`` against the simulated torch_gcu.

The simulator installs once per process (torch renames PrivateUse1 only once), so every
program that installs it runs in its own interpreter. The programs load ``mmgcu.sim``
without running ``mmgcu/__init__.py`` (``programs/sim_alone.py``), to prove the simulator
alone; ``test_install.py`` covers the ``import mmgcu`` route.
"""

import os
import subprocess
import sys

from tests.conftest import REPO, clean_env, free_port, last_json, run_program

PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")
#: The torch_gcu generations the simulator models, and their cards' device type.
APIS = ("gcu2", "gcu1")
DEVICE_TYPE = {"gcu2": "gcu", "gcu1": "xla"}


def program(name):
    """The path of ``programs/<name>.py``."""
    return os.path.join(PROGRAMS, f"{name}.py")


def run_sim(name, *args, api=None, cards=8, timeout=300, check=True, **env):
    """Run program ``name`` with ``MMGCU_SIMULATE=cards`` and ``MMGCU_SIMULATE_API=api``
    (None: the simulator's default for this torch)."""
    env.setdefault("MMGCU_SIMULATE", cards)
    if api is not None:
        env.setdefault("MMGCU_SIMULATE_API", api)
    return run_program(program(name), *args, timeout=timeout, check=check, **env)


def sim_json(name, *args, api=None, cards=8, **env):
    """Run program ``name`` on the simulator and return the last JSON line it printed."""
    return last_json(run_sim(name, *args, api=api, cards=cards, **env).stdout)


def run_ranks(name, world_size=2, timeout=240, **env):
    """Run program ``name`` (in ``programs/``, or a path) as ``world_size`` ranks at once
    (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_* set).

    Returns each rank's last JSON line, in rank order; fails with every rank's output if
    one rank fails or they do not finish in ``timeout`` seconds.
    """
    port = free_port()
    procs = []
    for rank in range(world_size):
        rank_env = clean_env(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            RANK=rank,
            LOCAL_RANK=rank,
            WORLD_SIZE=world_size,
            **env,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, name if os.path.isfile(name) else program(name)],
                env=rank_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
        )
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        outputs = [proc.communicate() for proc in procs]
        raise AssertionError(f"ranks timed out after {timeout}s: {outputs}") from None
    failed = [r for r, proc in enumerate(procs) if proc.returncode != 0]
    if failed:
        report = "\n".join(
            f"--- rank {r} (exit {procs[r].returncode})\n{out}\n{err}"
            for r, (out, err) in enumerate(outputs)
        )
        raise AssertionError(f"rank(s) {failed} failed:\n{report}")
    return [last_json(out) for out, _ in outputs]
