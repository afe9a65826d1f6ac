"""Stock mmengine on the simulator fails exactly as the seeds report: what mmgcu fixes."""

import pytest

from tests.conftest import run_python

pytestmark = pytest.mark.e2e

# A stock Runner (no mmgcu runner, no mmgcu wrapper) on a tiny real model.
STOCK_RUNNER = """
import os, sys, torch
import mmgcu  # installs the simulator (MMGCU_SIMULATE); registers, but nothing selects, mmgcu
from mmengine.runner import Runner
from mmengine.model import BaseModel

class Net(BaseModel):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)
    def forward(self, x, mode='loss'):
        return dict(loss=self.fc(x).sum())

{prelude}
runner = Runner(model=Net(), work_dir=sys.argv[1] if len(sys.argv) > 1 else '{work}',
                launcher='pytorch', env_cfg=dict(dist_cfg=dict(backend='gloo')))
"""

ENV = dict(
    MMGCU_SIMULATE=2,
    RANK=0,
    LOCAL_RANK=0,
    WORLD_SIZE=1,
    LOCAL_WORLD_SIZE=1,
    MASTER_ADDR="127.0.0.1",
)


def test_stock_init_dist_calls_torch_cuda_set_device(tmp_path):
    """Seed 002: mmengine's _init_dist_pytorch calls torch.cuda.set_device on a GCU host."""
    from tests.e2e.conftest import free_port

    code = STOCK_RUNNER.format(prelude="", work=tmp_path)
    # MMGCU_TRACEBACK=1: the stock traceback (mmgcu's hint replaces it otherwise, test_errors.py).
    proc = run_python(code, check=False, MASTER_PORT=free_port(), MMGCU_TRACEBACK=1, **ENV)
    assert proc.returncode != 0
    err = proc.stderr
    assert "_init_dist_pytorch" in err and "torch.cuda.set_device(local_rank)" in err, err[-3000:]
    # It dies inside torch.cuda: the seeds' CUDA-built torch says "Found no NVIDIA driver",
    # the CPU build here has no CUDA binding at all.
    assert "torch/cuda/__init__.py" in err
    assert "NVIDIA driver" in err or "no attribute '_cuda_setDevice'" in err


@pytest.mark.parametrize("api,device_type", [("v2", "gcu"), ("legacy", "xla")])
def test_stock_wrap_model_leaves_model_on_cpu(api, device_type, tmp_path):
    """Seeds 000/001: group made by hand, stock wrap_model gives DDP a CPU model."""
    from tests.e2e.conftest import free_port

    prelude = (
        "import torch.distributed as dist\n"
        f"dist.init_process_group({'cpu:gloo,gcu:eccl' if api == 'v2' else 'gloo'!r})\n"
        f"import torch_gcu\n"
    )
    code = STOCK_RUNNER.format(prelude=prelude, work=tmp_path)
    proc = run_python(code, check=False, MASTER_PORT=free_port(), MMGCU_SIMULATE_API=api, **ENV)
    assert proc.returncode != 0
    err = proc.stderr
    assert "DistributedDataParallel device_ids and output_device arguments" in err, err[-3000:]
    assert "module parameters {device(type='cpu')}" in err
