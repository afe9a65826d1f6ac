"""torch_gcu 1.x's Python API over torch_xla, so that mmgcu's own runner runs on the oracle.

torch_gcu 1.x forks torch_xla: its ``_GCUC`` module has torch_xla's ``_sync_multi``,
``_sync_live_tensors`` and ``metrics_report`` (``torch_gcu/core/model.py`` and ``debug.py``
of the 1.x source call them). This module gives the handful of torch_gcu functions that
mmgcu's ``GCU1Accelerator`` calls on one card, each the torch_xla call it forks, so the
conformance suite runs GCURunner's training and validation loops on a real XLA runtime and
compares them with the same loops on a simulated T20 card. It is test code for the oracle
(one process, no ECCL): the simulator in ``mmgcu/sim`` is what rehearses the T20.
"""

import enum
import sys
import types


class JitRunMode(enum.Enum):
    SYNC = 0
    ASYNC = 1
    SAFEASYNC = 2


def install() -> types.ModuleType:
    """Make ``import torch_gcu`` give this API over torch_xla's one CPU device."""
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    module = types.ModuleType("torch_gcu")
    device = torch_xla.device()

    def sync_multi(tensors, mode=None):
        # torch_gcu's _GCUC._sync_multi is torch_xla's, which unlazy and optimizer_step call
        torch_xla._XLAC._xla_sync_multi(list(tensors), devices=[], wait=False)

    module.JitRunMode = JitRunMode
    module.get_version = lambda: "torch_xla " + torch_xla.__version__
    module.is_available = lambda: True
    module.device_count = lambda: 1
    module.current_device = lambda: 0
    module.set_device = lambda index: None
    module.gcu_device = lambda index=None: device
    module.get_device_name = lambda index=0: "XLA CPU (torch_xla)"
    module.get_hbm_alloc_size = lambda index=None: 0
    module.manual_seed_all = lambda seed: xm.set_rng_state(int(seed))
    module.unlazy = sync_multi
    module.sync_lived_tensor = lambda device=None, mode=None: xm.mark_step()
    module.collect_buffers = lambda model: [b.data for b in model.buffers()]
    module.metrics_report = met.metrics_report
    # torch_gcu 1.x's DDP class (torch_gcu.nn.parallel); one process builds none, but
    # mmgcu asks which class it is
    module.nn = types.ModuleType("torch_gcu.nn")
    module.nn.parallel = types.SimpleNamespace(
        DistributedDataParallel=torch.nn.parallel.DistributedDataParallel
    )
    module.distributed = types.ModuleType("torch_gcu.distributed")
    module.distributed.is_eccl_available = lambda: False
    sys.modules["torch_gcu"] = module
    sys.modules["torch_gcu.distributed"] = module.distributed
    return module
