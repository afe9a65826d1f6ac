"""A stock mmengine Runner (no mmgcu runner, no mmgcu wrapper) on a tiny real model, for
tests/e2e/test_stock_fails.py: ``python stock_runner.py WORK_DIR [GROUP_BACKEND]``.

With GROUP_BACKEND the process group is made by hand first (as users did to get
past mmengine's ``init_dist``); the simulator is installed by ``import mmgcu``
(MMGCU_SIMULATE), which registers mmgcu's classes but selects none of them.
"""

import sys

import torch
from mmengine.model import BaseModel
from mmengine.runner import Runner

import mmgcu  # noqa: F401


class Net(BaseModel):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)

    def forward(self, x, mode="loss"):
        return dict(loss=self.fc(x).sum())


if len(sys.argv) > 2:
    import torch.distributed as dist

    dist.init_process_group(sys.argv[2])
    import torch_gcu  # noqa: F401

Runner(
    model=Net(),
    work_dir=sys.argv[1],
    launcher="pytorch",
    env_cfg=dict(dist_cfg=dict(backend="gloo")),
)
