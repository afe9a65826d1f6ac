"""The simulated torch_gcu 1.x (the T20 stack, TopsRider 2.x, torch 1.10).

Every module here models the file of the same path in the Python layer of a public
torch_gcu 1.x release (repository ``mango-MilkT/GCU-PC-share``, folder ``torch_gcu/``)
and says what it keeps from it; where that source is silent, the strictest reading is
taken and said so. The cards are the native part's XLA devices (``xla:N``).
``mmgcu.sim.install`` registers this package as ``torch_gcu`` and its modules as
``torch_gcu.<module>``.
"""

from . import amp, distributed, nn  # noqa: F401
from .core import pytorch_override
from .core.debug import dump_hbm_alloc_info, get_hbm_alloc_size, metrics_report  # noqa: F401
from .core.device import (  # noqa: F401
    current_device,
    device,
    device_count,
    device_of,
    gcu_device,
    get_device_name,
    is_available,
    set_device,
)
from .core.model import (  # noqa: F401
    JitRunMode,
    clear_graph_caches,
    collect_amp_training_params,
    collect_buffers,
    fetch_gradients,
    optimizer_step,
    sync_lived_tensor,
    synchronize,
    unlazy,
)
from .core.random import manual_seed_all  # noqa: F401
from .core.version import get_version  # noqa: F401

__simulated__ = True

pytorch_override.install()
