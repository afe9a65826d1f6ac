"""Run the ``mmgcu`` command in a fresh process, as a user would."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, TORCH_1, clean_env

HERE = os.path.dirname(os.path.abspath(__file__))
FAULTS = os.path.join(HERE, "faults")
#: Stand-in scripts that mmgcu train/test launch under torchrun in the tests.
PROGRAMS = os.path.join(HERE, "programs")


def mmgcu(*args, timeout=120, fault=None, **env):
    """``python -m mmgcu.cli ARGS`` with ``env`` added to a clean environment.

    ``fault`` puts ``faults/sitecustomize.py`` on the path of every process of the run and
    names the fault for rank 1 (``MMGCU_TEST_FAULT``).
    """
    env = clean_env(**env)
    if fault:
        env["PYTHONPATH"] = FAULTS + os.pathsep + env["PYTHONPATH"]
        env["MMGCU_TEST_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-m", "mmgcu.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


@pytest.fixture(scope="session")
def wheel_install(tmp_path_factory):
    """(bin folder of the venv with mmgcu from a wheel of this checkout, a work folder
    outside the checkout), under the machine lock until this worker's session ends (another
    session's wheel tests wait for it). Its tests are ``one_worker("wheel")``."""
    if TORCH_1:
        pytest.skip(
            "installs the torch 2.x CPU wheel of the main leg (the T20 leg installs mmgcu "
            "with tools/install_t20.sh)"
        )
    from tests.cli import wheel

    with wheel.machine_lock():
        tmp = tmp_path_factory.mktemp("wheel")
        yield wheel.make_venv(wheel.build_wheel(tmp), tmp), tmp
