"""Run snippets against the simulated torch_gcu, one fresh interpreter each.

The simulator installs once per process (torch renames PrivateUse1 only once), so every
snippet that installs it runs in its own interpreter. The snippets load ``mmgcu.sim`` without
running ``mmgcu/__init__.py``: that file imports mmengine and, with ``MMGCU_SIMULATE`` set,
installs the simulator by itself; these tests prove the simulator alone, whatever else is
installed (``test_install.py`` covers the ``import mmgcu`` route).
"""

import os
import subprocess
import sys
import textwrap

from tests.conftest import REPO, clean_env, free_port, last_json, run_python

DEVICE_TYPE = {"gcu2": "gcu", "gcu1": "xla", "v2": "gcu", "legacy": "xla"}

PRELUDE = f"""\
import sys as _sys
import types as _types

_pkg = _types.ModuleType("mmgcu")
_pkg.__path__ = [{os.path.join(REPO, "mmgcu")!r}]
_sys.modules["mmgcu"] = _pkg
"""


def sim_code(code):
    """``code`` (dedented) after the prelude that makes ``mmgcu.sim`` importable alone."""
    return PRELUDE + textwrap.dedent(code)


def run_sim(code, api="v2", cards=8, timeout=300, check=True, **env):
    """Run ``code`` with ``MMGCU_SIMULATE=cards`` and ``MMGCU_SIMULATE_API=api`` set."""
    env.setdefault("MMGCU_SIMULATE", cards)
    env.setdefault("MMGCU_SIMULATE_API", api)
    return run_python(sim_code(code), timeout=timeout, check=check, **env)


def sim_json(code, api="v2", cards=8, **env):
    """Run ``code`` on the simulator and return the last JSON line it printed."""
    return last_json(run_sim(code, api=api, cards=cards, **env).stdout)


def run_ranks(code, world_size=2, timeout=240, **env):
    """Run ``code`` (a snippet, or the path of a program) as ``world_size`` ranks at once
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
                [sys.executable, code]
                if os.path.isfile(code)
                else [sys.executable, "-c", sim_code(code)],
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
