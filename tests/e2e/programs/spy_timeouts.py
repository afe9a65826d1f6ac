"""Builds the config's runner with ``env_cfg.dist_cfg.timeout=123`` (what --cfg-options
does) and prints, as JSON, the timeout each process-group creation received: the
torch.distributed group and, on torch_gcu 1.x, torch_gcu.distributed's ECCL group.

Usage: spy_timeouts.py CONFIG WORK_DIR (one rank, with the launcher's variables set)
"""

import json
import sys

import torch.distributed as dist

import mmgcu  # noqa: F401  (installs the simulated torch_gcu first)

seen = {}


def spy(module, label):
    """Record the ``timeout`` of each ``module.init_process_group`` call under ``label``."""
    real = module.init_process_group
    seen[label] = []

    def init_process_group(*args, **kwargs):
        timeout = kwargs.get("timeout")
        seen[label].append(timeout.total_seconds() if timeout is not None else None)
        return real(*args, **kwargs)

    module.init_process_group = init_process_group


spy(dist, "torch.distributed")
try:
    import torch_gcu.distributed as gcu_dist  # torch_gcu 1.x: a world of its own
except ImportError:
    gcu_dist = None
if gcu_dist is not None and hasattr(gcu_dist, "init_process_group"):
    spy(gcu_dist, "torch_gcu.distributed")

from mmengine.config import Config  # noqa: E402
from mmseg.registry import RUNNERS  # noqa: E402

cfg = Config.fromfile(sys.argv[1])
cfg.merge_from_dict({"env_cfg.dist_cfg.timeout": 123})
cfg.launcher, cfg.work_dir = "pytorch", sys.argv[2]
RUNNERS.build(cfg)
print(json.dumps(seen))
