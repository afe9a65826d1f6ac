"""mmgcu: stock OpenMMLab training on all cards of an Enflame GCU server.

Importing mmgcu (``custom_imports=dict(imports=['mmgcu'])``) registers ``GCURunner``,
the GCU model and optimizer wrappers, loops, log processor and hooks in mmengine's root
registries. With ``MMGCU_SIMULATE=<cards>`` set, it first installs the simulated
torch_gcu (``mmgcu.sim``), before anything probes the device. On a GCU host it also
installs a narrow error hook (:mod:`mmgcu.runtime.excepthook`), which is what names the fix
when a script builds mmengine's own Runner there.
"""

from . import sim as _sim
from .version import __version__

if _sim.requested():
    _sim.install()

from .checkpoint.hooks import CPUCheckpointHook, GCUCheckpointHook  # noqa: E402
from .counterparts import replaces  # noqa: E402
from .device import Accelerator, select_accelerator  # noqa: E402
from .engine.hooks import (  # noqa: E402
    GCUCompileWatchHook,
    GCUDevicePlacementHook,
    GCUEmptyCacheHook,
    GCURuntimeInfoHook,
    GCUWatchdogHook,
)
from .engine.log_processor import GCULogProcessor  # noqa: E402
from .engine.loops import GCUTestLoop, GCUValLoop  # noqa: E402
from .engine.runner import GCURunner  # noqa: E402
from .errors import GCUError  # noqa: E402
from .model import GCU1DistributedDataParallel, GCUDistributedDataParallel  # noqa: E402
from .optim import GCUAmpOptimWrapper, GCUOptimWrapper  # noqa: E402
from .runtime import excepthook as _excepthook  # noqa: E402

_excepthook.install_on_gcu_host()

__all__ = [
    "Accelerator",
    "CPUCheckpointHook",
    "GCU1DistributedDataParallel",
    "GCUAmpOptimWrapper",
    "GCUCheckpointHook",
    "GCUCompileWatchHook",
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
