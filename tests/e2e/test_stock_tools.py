"""Stock OpenMMLab tools with a GCU config: mmseg 1.2.2's own tools/test.py builds
mmengine's Runner whatever runner_type says. On a GCU config and a checkpoint GCURunner
trained, it runs on the CPU of a (simulated) card host and prints mIoU, instead of
"'Runner' object has no attribute 'accelerator'" at its first log line; on torch >= 2.6 it
loads the checkpoint with stock mmengine (``weights_only=True``).
"""

import subprocess
import sys

import pytest

from tests.conftest import one_worker
from tests.e2e.conftest import (
    LEG_API,
    REPO,
    clean_env,
    finish,
    mmseg_tool,
    torchrun,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.t20, one_worker(__name__)]

UNBOUND = "GCULogProcessor acts as mmengine's LogProcessor: it was not built by GCURunner"


def one_process(tool, *args, python=sys.executable, api=LEG_API, timeout=600):
    """``python TOOL ARGS --launcher none`` on one simulated card of torch_gcu ``api``."""
    env = clean_env(MMGCU_SIMULATE=1, MMGCU_SIMULATE_API=api, OMP_NUM_THREADS=1)
    return subprocess.run(
        [python, tool, *map(str, args), "--launcher", "none"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def trained(tmp_path, dataset, **overrides):
    """A GCU config and the checkpoint GCURunner wrote for it (2 iterations, one card)."""
    cfg = write_config(
        tmp_path / "gcu_config.py",
        dataset,
        train_cfg=dict(type="IterBasedTrainLoop", max_iters=2, val_interval=100),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", by_epoch=False, interval=2)),
        **overrides,
    )
    work = tmp_path / "train"
    proc = one_process(mmseg_tool("train.py"), cfg, "--work-dir", work)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "GCURunner" not in proc.stderr  # no traceback naming it
    return cfg, str(work / "iter_2.pth")


@pytest.fixture(scope="module")
def gcu_checkpoint(dataset, tmp_path_factory):
    return trained(tmp_path_factory.mktemp("stock_tools"), dataset)


def test_stock_test_py_prints_miou_for_a_gcu_config(gcu_checkpoint, tmp_path):
    cfg, checkpoint = gcu_checkpoint

    proc = one_process(mmseg_tool("test.py"), cfg, checkpoint, "--work-dir", tmp_path)

    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "AttributeError" not in out
    assert "mIoU" in out and "Iter(test) [" in out
    assert f"Load checkpoint from {checkpoint}" in out
    # mmengine's own Runner built GCULogProcessor, which says once what it does.
    assert out.count(UNBOUND) == 1, out[-4000:]


def test_stock_test_py_under_torchrun_names_itself_and_mmgcu_test(gcu_checkpoint, tmp_path):
    """Under a launcher, mmengine's Runner sets a CUDA device on the GCU host: the fix is
    not the config (it sets runner_type) but the script, said once."""
    cfg, checkpoint = gcu_checkpoint
    tool = mmseg_tool("test.py")
    code, out = finish(
        torchrun([tool, cfg, checkpoint, "--launcher", "pytorch", "--work-dir", tmp_path], 2, 2)
    )
    assert code != 0
    said = "test.py builds mmengine's own Runner whatever runner_type says"
    assert out.count(said) == 1, out[-4000:]
    assert "'mmgcu test CONFIG CHECKPOINT [CARDS] ...'" in out
    assert "Add runner_type = 'GCURunner'" not in out
    assert "mmgcu: rank 1 stops: rank 0 says why" in out
