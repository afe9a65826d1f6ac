"""A venv with mmgcu installed from its own freshly built wheel, as a new user installs it.

The venv lives at one fixed path (so the simulator's compiled part, keyed by its source
path, is built once per machine). Its dependencies come from the local wheels and pip's
cache (mmcv with ops is built once and cached) and are kept while the requirements, torch
and Python they were installed for are unchanged (a stamp file says which); mmgcu itself
is uninstalled, checked gone and installed from the new wheel on every session. Under a
lock, so two sessions on one machine take turns.
"""

import contextlib
import fcntl
import hashlib
import os
import os.path as osp
import shutil
import subprocess
import sys

import torch

from tests.conftest import REPO, clean_env

HOME = osp.join(osp.expanduser("~"), ".cache", "mmgcu", "wheel-test")
VENV = osp.join(HOME, "venv")
TORCH = f"torch=={torch.__version__.split('+')[0]}"
# Not part of the wheel test's checkout copy: environments, outputs, caches, VCS.
IGNORED = shutil.ignore_patterns(
    ".git", ".venv*", "data", "work_dirs", "zoo_results", "bench_results", "build",
    "*.egg-info", "__pycache__", ".*_cache",
)  # fmt: skip


def run(cmd, cwd, timeout=600, **env):
    """Run ``cmd`` with a clean environment (no checkout on PYTHONPATH); return the process."""
    full = clean_env(**env)
    full.pop("PYTHONPATH", None)
    full.setdefault("PIP_NO_WARN_CONFLICTS", "1")
    proc = subprocess.run(
        [str(c) for c in cmd],
        cwd=str(cwd),
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout + proc.stderr


def ok(result):
    code, out = result
    assert code == 0, out[-5000:]
    return out


def build_wheel(tmp) -> str:
    """The wheel of a copy of this checkout (the build leaves build/ and egg-info behind)."""
    src = tmp / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=IGNORED)
    pip = [sys.executable, "-m", "pip"]
    ok(run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", src], tmp))
    (wheel,) = os.listdir(tmp / "dist")
    return str(tmp / "dist" / wheel)


REQUIREMENTS = [osp.join(REPO, "requirements", n) for n in ("runtime.txt", "optional.txt")]
# torch 2.13 asks for setuptools>=77, but mmcv 2.1.0's build and mmengine 0.10.7's
# pkg_resources need setuptools<70: torch goes in without its dependency list.
DEPS = ["setuptools<70", "filelock", "fsspec", "jinja2", "networkx", "sympy", "typing-extensions"]
DEPS += ["ninja", "-r", REQUIREMENTS[0], "-r", REQUIREMENTS[1]]


def deps_stamp() -> str:
    """What the venv's dependencies were installed for: Python, torch, the pins."""
    # The requirement files by content, not by path: every clone of the checkout shares it.
    pins = [osp.basename(d) if d in REQUIREMENTS else d for d in DEPS]
    python = osp.realpath(sys._base_executable)  # the venv's own interpreter links to it
    digest = hashlib.sha1(f"{python} {sys.version} {TORCH} {pins}".encode())
    for path in REQUIREMENTS:
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def _read(path: str):
    if not osp.exists(path):
        return None
    with open(path) as f:
        return f.read()


def make_venv(wheel: str, tmp) -> str:
    """The venv with torch, mmcv (ops), mmengine, mmseg (kept while its stamp matches),
    then mmgcu from ``wheel`` alone."""
    python = osp.join(VENV, "bin", "python")
    stamp = osp.join(VENV, ".deps-stamp")
    pip = [python, "-m", "pip", "install", "-q"]
    if _read(stamp) != deps_stamp():
        shutil.rmtree(VENV, ignore_errors=True)
        ok(run([sys._base_executable, "-m", "venv", VENV], tmp))
        ok(run(pip + ["--no-deps", TORCH], tmp))
        ok(run(pip + ["--no-build-isolation"] + DEPS, tmp))
        # One process writes yapf's grammar cache (see make install), not the first ranks.
        ok(run([python, "-c", "import yapf"], tmp))
        with open(stamp, "w") as f:
            f.write(deps_stamp())
    ok(run([python, "-m", "pip", "uninstall", "-q", "-y", "mmgcu"], tmp))
    code, out = run([python, "-c", "import mmgcu"], tmp)
    assert code != 0 and "No module named 'mmgcu'" in out, "an earlier mmgcu is left: " + out
    ok(run(pip + ["--no-deps", "--no-build-isolation", wheel], tmp))
    return osp.join(VENV, "bin")


@contextlib.contextmanager
def machine_lock():
    """The venv to this process alone until the block ends."""
    os.makedirs(HOME, exist_ok=True)
    with open(osp.join(HOME, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
