"""The built wheel alone: installed into a clean venv, ``mmgcu train`` and ``mmgcu test`` run
mmseg on simulated cards with nothing of the checkout on the path (2 cards: the 8-card runs
are tests/e2e's; this test is about what the wheel holds).

The venv lives at one fixed path (so the simulator's compiled part, keyed by its source
path, is built once per machine). Its dependencies come from the local wheels and pip's
cache (mmcv with ops is built once and cached) and are kept while the requirements, torch
and Python they were installed for are unchanged (a stamp file says which); mmgcu itself
is uninstalled, checked gone and installed from the new wheel on every run. Under a lock,
so two runs on one machine take turns.
"""

import fcntl
import hashlib
import os
import os.path as osp
import re
import shutil
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO, clean_env, one_worker

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.long,
    pytest.mark.skipif(
        torch.__version__.startswith("1."),
        reason="installs the torch 2.x CPU wheel of the main leg (the T20 leg installs mmgcu "
        "with tools/install_t20.sh)",
    ),
    one_worker(__name__),
]

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
        with open(stamp, "w") as f:
            f.write(deps_stamp())
    ok(run([python, "-m", "pip", "uninstall", "-q", "-y", "mmgcu"], tmp))
    code, out = run([python, "-c", "import mmgcu"], tmp)
    assert code != 0 and "No module named 'mmgcu'" in out, "an earlier mmgcu is left: " + out
    ok(run(pip + ["--no-deps", "--no-build-isolation", wheel], tmp))
    return osp.join(VENV, "bin")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(bin folder of the venv, a work folder outside the checkout), under the machine lock."""
    os.makedirs(HOME, exist_ok=True)
    with open(osp.join(HOME, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        tmp = tmp_path_factory.mktemp("wheel")
        yield make_venv(build_wheel(tmp), tmp), tmp
        fcntl.flock(lock, fcntl.LOCK_UN)


def test_wheel_ships_configs_and_entry_points(installed):
    bin_dir, tmp = installed
    where = ok(run([osp.join(bin_dir, "python"), "-c", "import mmgcu; print(mmgcu.__file__)"], tmp))
    assert where.strip().startswith(VENV), "mmgcu must come from the wheel, not the checkout"
    base = ok(run([osp.join(bin_dir, "mmgcu"), "configs", "_base_/gcu_runtime.py"], tmp)).strip()
    assert base.startswith(VENV) and osp.isfile(base)
    listing = ok(run([osp.join(bin_dir, "mmgcu"), "configs"], tmp))
    assert "tiny/fcn_r18-tiny_8xgcu_synthetic-64x64.py" in listing


def test_train_and_test_on_simulated_cards(installed):
    bin_dir, tmp = installed
    mmgcu = osp.join(bin_dir, "mmgcu")
    python = osp.join(bin_dir, "python")
    data = tmp / "data"
    ok(run([python, osp.join(REPO, "tools", "make_synthetic_dataset.py"), data], tmp))
    tiny = ok(run([mmgcu, "configs", "fcn_r18-tiny_8xgcu_synthetic-64x64"], tmp)).strip()
    cfg = tmp / "my_config.py"
    cfg.write_text(
        f"_base_ = [{tiny!r}]\n"
        f"data_root = {str(data)!r}\n"
        "train_dataloader = dict(dataset=dict(data_root=data_root))\n"
        "val_dataloader = dict(dataset=dict(data_root=data_root))\n"
        "test_dataloader = val_dataloader\n"
        # mmgcu test validates below: no validation during training.
        "train_cfg = dict(type='IterBasedTrainLoop', max_iters=4, val_interval=100)\n"
    )
    out = ok(run([mmgcu, "train", cfg, "--work-dir", tmp / "work"], tmp, MMGCU_SIMULATE=2))
    assert "mmgcu train: 2 process(es), one per card (MMGCU_SIMULATE=2" in out
    assert "Iter(train) [4/4]" in out
    ckpt = tmp / "work" / "iter_4.pth"
    assert ckpt.exists()
    out = ok(run([mmgcu, "test", cfg, ckpt, "--work-dir", tmp / "test"], tmp, MMGCU_SIMULATE=2))
    assert "-m mmgcu.cli.test_entry" in out and "Distributed launcher: pytorch" in out
    assert re.search(r"Iter\(test\) \[(\d+)/\1\]", out) and "mIoU" in out
