"""The built wheel alone: installed into a clean venv (``tests/cli/wheel.py``), it ships
the configs and the ``mmgcu`` command, with nothing of the checkout on the path. The README's
walkthrough (``test_walkthrough.py``) then trains, tests and rehearses on simulated cards
with that command, as a new user who installed the wheel would.
"""

import os.path as osp

import pytest
import torch

from tests.cli.wheel import VENV, ok, run
from tests.conftest import one_worker

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.long,  # the wheel's build and install
    pytest.mark.skipif(
        torch.__version__.startswith("1."),
        reason="installs the torch 2.x CPU wheel of the main leg (the T20 leg installs mmgcu "
        "with tools/install_t20.sh)",
    ),
    one_worker("wheel"),
]


def test_wheel_ships_configs_and_entry_points(wheel_install):
    bin_dir, tmp = wheel_install
    where = ok(run([osp.join(bin_dir, "python"), "-c", "import mmgcu; print(mmgcu.__file__)"], tmp))
    assert where.strip().startswith(VENV), "mmgcu must come from the wheel, not the checkout"
    base = ok(run([osp.join(bin_dir, "mmgcu"), "configs", "_base_/gcu_runtime.py"], tmp)).strip()
    assert base.startswith(VENV) and osp.isfile(base)
    listing = ok(run([osp.join(bin_dir, "mmgcu"), "configs"], tmp))
    assert "tiny/fcn_r18-tiny_8xgcu_synthetic-64x64.py" in listing
