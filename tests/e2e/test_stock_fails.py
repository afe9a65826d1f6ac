"""Stock mmengine on the simulator fails as it does on a GCU host: what mmgcu fixes."""

import os.path as osp

import pytest

from tests.conftest import run_program
from tests.e2e.conftest import PROGRAMS

pytestmark = pytest.mark.e2e

STOCK_RUNNER = osp.join(PROGRAMS, "stock_runner.py")

ENV = dict(
    MMGCU_SIMULATE=2,
    RANK=0,
    LOCAL_RANK=0,
    WORLD_SIZE=1,
    LOCAL_WORLD_SIZE=1,
    MASTER_ADDR="127.0.0.1",
)


def test_stock_init_dist_calls_torch_cuda_set_device(tmp_path):
    """mmengine's _init_dist_pytorch calls torch.cuda.set_device on a GCU host."""
    from tests.e2e.conftest import free_port

    # MMGCU_TRACEBACK=1: the stock traceback (mmgcu's hint replaces it otherwise,
    # tests/runtime/test_excepthook.py).
    env = dict(ENV, MASTER_PORT=free_port(), MMGCU_TRACEBACK=1)
    proc = run_program(STOCK_RUNNER, tmp_path, check=False, **env)
    assert proc.returncode != 0
    err = proc.stderr
    assert "_init_dist_pytorch" in err and "torch.cuda.set_device(local_rank)" in err, err[-3000:]
    # It dies inside torch.cuda: the seeds' CUDA-built torch says "Found no NVIDIA driver",
    # the CPU build here has no CUDA binding at all.
    assert "torch/cuda/__init__.py" in err
    assert "NVIDIA driver" in err or "no attribute '_cuda_setDevice'" in err


@pytest.mark.parametrize("api,device_type", [("v2", "gcu"), ("legacy", "xla")])
def test_stock_wrap_model_leaves_model_on_cpu(api, device_type, tmp_path):
    """A group made by hand gets past init_dist; then stock wrap_model gives DDP a CPU model."""
    from tests.e2e.conftest import free_port

    group = "cpu:gloo,gcu:eccl" if api == "v2" else "gloo"
    env = dict(ENV, MASTER_PORT=free_port(), MMGCU_SIMULATE_API=api)
    proc = run_program(STOCK_RUNNER, tmp_path, group, check=False, **env)
    assert proc.returncode != 0
    err = proc.stderr
    assert "DistributedDataParallel device_ids and output_device arguments" in err, err[-3000:]
    assert "module parameters {device(type='cpu')}" in err
