"""The README's walkthrough, "Your own mmseg model on a T20", as a new user runs it.

An mmseg config on mmseg's own ``default_runtime.py`` with mmgcu's two keys is rehearsed on
simulated T20 cards with the README's own command lines, run by bash with ``mmgcu`` from a
venv where it was installed from its wheel (``wheel_install``: nothing of the checkout on
the path): ``mmgcu rehearse`` and its report, then a short training and a test. The same
config without the keys is refused before any process starts. Each command line run here
must be in both READMEs, word for word; they run on 2 of the T20's 8 cards (``--cards 2``,
``MMGCU_SIMULATE=t20:2``), since their paths are the same for any count: the 8-card run of
the tests (``eight_card_run``, on this leg ``make demo``'s) trains on all 8.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, clean_env, one_worker
from tests.rehearsal.helpers import assert_tiny_model_passed_every_phase

TINY = os.path.join(REPO, "configs", "tiny", "_base_", "fcn_r18-tiny_synthetic-64x64.py")
KEYS = """custom_imports = dict(imports=["mmgcu"], allow_failed_imports=False)
runner_type = "GCURunner"
"""
REPORT = "mmgcu rehearse my_config.py"
REHEARSE = (
    "MMGCU_SIMULATE=t20 mmgcu train my_config.py --cfg-options train_cfg.max_iters=4 "
    "train_cfg.val_interval=4 default_hooks.checkpoint.interval=4"
)
TEST = "MMGCU_SIMULATE=t20 mmgcu test my_config.py work_dirs/my_config/iter_4.pth"


def on_two_cards(line: str) -> str:
    """``line`` on 2 simulated T20 cards instead of 8."""
    if line.startswith("mmgcu rehearse "):
        return line + " --cards 2"
    assert line.startswith("MMGCU_SIMULATE=t20 "), line
    return line.replace("MMGCU_SIMULATE=t20 ", "MMGCU_SIMULATE=t20:2 ", 1)


#: Pretrained weights as the README says to name them: a local file, on the T20 host (not
#: on this machine, where the rehearsal starts from random weights and says so).
PRETRAINED = "pretrain/resnet18_v1c.pth"


def user_config(folder, dataset, keys=KEYS, extra="") -> None:
    """``my_config.py``: a model and data of the user's on mmseg's own runtime."""
    (folder / "my_config.py").write_text(
        f'_base_ = ["mmseg::_base_/default_runtime.py", {TINY!r}]\n'
        f"{keys}"
        f"data_root = {dataset!r}\n"
        "train_dataloader = dict(dataset=dict(data_root=data_root))\n"
        "val_dataloader = dict(dataset=dict(data_root=data_root))\n"
        "test_dataloader = val_dataloader\n"
        f"{extra}"
    )


def shell(line, cwd, bin_dir, timeout=600):
    """``line`` as a user types it, with ``bin_dir``'s ``mmgcu`` first on PATH."""
    env = clean_env(OMP_NUM_THREADS=1)
    env.pop("PYTHONPATH")
    env["PATH"] = bin_dir + os.pathsep + env["PATH"]
    proc = subprocess.run(
        ["bash", "-c", line], cwd=str(cwd), env=env, capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("readme", ["README.md", "README_zh-CN.md"])
def test_the_readmes_show_these_commands(readme):
    with open(os.path.join(REPO, readme), encoding="utf-8") as f:
        text = f.read()
    for line in (REPORT, REHEARSE, TEST, *KEYS.splitlines()):
        assert line in text, f"{readme} lacks: {line}"


@pytest.mark.e2e
@pytest.mark.long
@one_worker("wheel")
def test_the_rehearsal_report_of_simulated_t20_cards(dataset, tmp_path, wheel_install):
    init = f"dict(type='Pretrained', checkpoint={PRETRAINED!r})"
    user_config(tmp_path, dataset, extra=f"model = dict(backbone=dict(init_cfg={init}))\n")
    code, out = shell(on_two_cards(REPORT), tmp_path, wheel_install[0])
    assert code == 0, out[-5000:]
    assert "2 simulated T20 card(s) (torch_gcu 1.x" in out
    assert "card 1 (rank 1): peak" in out and "of 32.00 GiB: fits" in out, out[-5000:]
    assert "verdict: PASSED: launch it on the T20 with mmgcu train CONFIG" in out
    with open(tmp_path / "work_dirs" / "my_config_rehearsal" / "rehearsal.json") as f:
        assert_tiny_model_passed_every_phase(json.load(f), out, PRETRAINED)


@pytest.mark.e2e
@pytest.mark.long
@one_worker("wheel")
def test_rehearse_then_test_on_simulated_t20_cards(dataset, tmp_path, wheel_install):
    bin_dir = wheel_install[0]
    user_config(tmp_path, dataset)
    code, out = shell(on_two_cards(REHEARSE), tmp_path, bin_dir)
    assert code == 0, out[-5000:]
    assert "mmgcu train: 2 process(es), one per card (MMGCU_SIMULATE=t20:2" in out, out[-5000:]
    assert "torch_gcu is SIMULATED (T20: the torch_gcu 1.x API, xla:N; 2 cards" in out
    assert "rank 1 on " in out and "xla:1 (card 1 of 2)" in out, out[-5000:]
    assert "Iter(train) [4/4]" in out, out[-5000:]
    assert (tmp_path / "work_dirs" / "my_config" / "iter_4.pth").exists()

    code, out = shell(on_two_cards(TEST), tmp_path, bin_dir)
    assert code == 0, out[-5000:]
    assert "-m mmgcu.cli.test_entry" in out and "Distributed launcher: pytorch" in out
    assert re.search(r"Iter\(test\) \[(\d+)/\1\]", out), out[-5000:]
    assert re.search(r"mIoU: [0-9.]+", out), out[-5000:]
    assert "rank 1 on " in out, out[-5000:]


def test_a_config_without_the_keys_stops_before_any_process(dataset, tmp_path):
    """The refusal comes before any process: this environment's ``mmgcu`` (no wheel needed)."""
    bin_dir = os.path.dirname(sys.executable)
    assert shell("command -v mmgcu", tmp_path, bin_dir) == (0, os.path.join(bin_dir, "mmgcu\n"))
    user_config(tmp_path, dataset, keys="")
    code, out = shell(REHEARSE, tmp_path, bin_dir, timeout=60)
    assert code == 1, out
    lines = [line for line in out.splitlines() if line.strip()]
    (line,) = [line for line in lines if not line.startswith("mmgcu: torch_gcu is SIMULATED")]
    assert line.startswith("mmgcu train: error: my_config.py would run on mmengine's own Runner")
    assert "it sets no runner_type and no custom_imports" in line
    assert "custom_imports = dict(imports=['mmgcu'], allow_failed_imports=False)" in line
    assert "'mmgcu configs _base_/gcu_runtime.py'" in line
