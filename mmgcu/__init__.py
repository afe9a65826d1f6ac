"""mmgcu: stock OpenMMLab training on all cards of an Enflame GCU server.

Importing mmgcu (``custom_imports=dict(imports=['mmgcu'])``) registers ``GCURunner``,
the GCU model and optimizer wrappers, loops, log processor and hooks in mmengine's root
registries. With ``MMGCU_SIMULATE=<cards>`` set, it first installs the simulated
torch_gcu (``mmgcu.sim``), before anything probes the device. It also installs a narrow
error hook (:mod:`mmgcu.errors`).
"""

from . import sim as _sim
from .version import __version__

if _sim.requested():
    _sim.install()

from . import errors  # noqa: E402
from .counterparts import replaces  # noqa: E402
from .device import Accelerator, GCUError, select_accelerator  # noqa: E402
from .hooks import (  # noqa: E402
    CPUCheckpointHook,
    GCUCheckpointHook,
    GCUDevicePlacementHook,
    GCUEmptyCacheHook,
    GCURuntimeInfoHook,
)
from .log_processor import GCULogProcessor  # noqa: E402
from .loops import GCUTestLoop, GCUValLoop  # noqa: E402
from .model import GCU1DistributedDataParallel, GCUDistributedDataParallel  # noqa: E402
from .optim import GCUAmpOptimWrapper, GCUOptimWrapper  # noqa: E402
from .runner import GCURunner  # noqa: E402
from .watchdog import GCUWatchdogHook  # noqa: E402

errors.install()

__all__ = [
    "Accelerator",
    "CPUCheckpointHook",
    "GCU1DistributedDataParallel",
    "GCUAmpOptimWrapper",
    "GCUCheckpointHook",
    "GCUDevicePlacementHook",
    "GCUDistributedDataParallel",
    "GCUEmptyCacheHook",
    "GCUError",
    "GCULogProcessor",
    "GCUOptimWrapper",
    "GCURunner",
    "GCURuntimeInfoHook",
    "GCUTestLoop",
    "GCUValLoop",
    "GCUWatchdogHook",
    "__version__",
    "replaces",
    "select_accelerator",
]
