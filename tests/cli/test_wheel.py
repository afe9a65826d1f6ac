"""The built wheel alone: installed into a clean venv (``tests/cli/wheel.py``), it ships
the configs and the ``mmgcu`` command and simulates either torch_gcu generation, with
nothing of the checkout on the path. The README's walkthrough (``test_walkthrough.py``)
then rehearses, trains and tests on simulated T20 cards with that command, as a new user
who installed the wheel would.
"""

import os.path as osp

import pytest

from tests.cli.wheel import VENV, ok, run
from tests.conftest import one_worker

pytestmark = [pytest.mark.e2e, pytest.mark.long, one_worker("wheel")]  # long: the wheel's build


def test_wheel_ships_configs_and_entry_points(wheel_install):
    bin_dir, tmp = wheel_install
    where = ok(run([osp.join(bin_dir, "python"), "-c", "import mmgcu; print(mmgcu.__file__)"], tmp))
    assert where.strip().startswith(VENV), "mmgcu must come from the wheel, not the checkout"
    base = ok(run([osp.join(bin_dir, "mmgcu"), "configs", "_base_/gcu_runtime.py"], tmp)).strip()
    assert base.startswith(VENV) and osp.isfile(base)
    listing = ok(run([osp.join(bin_dir, "mmgcu"), "configs"], tmp))
    assert "tiny/fcn_r18-tiny_8xgcu_synthetic-64x64.py" in listing
    # A config of the wheel by its name, its _base_ chain (tiny/_base_/..., gcu_runtime.py)
    # inside the wheel too.
    name = "fcn_r18-tiny_8xgcu_synthetic-64x64"
    tiny = ok(run([osp.join(bin_dir, "mmgcu"), "configs", name], tmp)).strip()
    assert tiny.startswith(VENV), tiny
    load = "import sys, mmengine; print(mmengine.Config.fromfile(sys.argv[1]).runner_type)"
    assert ok(run([osp.join(bin_dir, "python"), "-c", load, tiny], tmp)).strip() == "GCURunner"


def test_wheel_simulates_torch_gcu_2x(wheel_install):
    """The walkthrough simulates T20 cards (1.x); the wheel's 2.x simulator and C++ part."""
    bin_dir, tmp = wheel_install
    step = "import mmgcu, torch; x = torch.ones(2, device='gcu:1'); print((x + x).device)"
    out = ok(run([osp.join(bin_dir, "python"), "-c", step], tmp, MMGCU_SIMULATE="s60:2"))
    assert out.splitlines()[0] == "gcu:1", out
    assert "SIMULATED (S60: the torch_gcu 2.x API, gcu:N; 2 cards" in out, out
