"""mmgcu: stock OpenMMLab training on all cards of an Enflame GCU server.

Importing mmgcu (``custom_imports=dict(imports=['mmgcu'])``) registers ``GCURunner``,
``GCUDistributedDataParallel`` and the GCU hooks in mmengine's root registries. With
``MMGCU_SIMULATE=<cards>`` set, it first installs the simulated torch_gcu (``mmgcu.sim``),
before anything probes the device.
"""

import os
import sys

from . import sim as _sim
from .version import __version__

if _sim.requested():
    _sim.install()

from .device import GCUError, get_backend  # noqa: E402
from .hooks import GCUDevicePlacementHook, GCUEmptyCacheHook  # noqa: E402
from .log_processor import GCULogProcessor  # noqa: E402
from .loops import GCUTestLoop, GCUValLoop  # noqa: E402
from .model import GCUDistributedDataParallel  # noqa: E402
from .optim import GCUAmpOptimWrapper, GCUOptimWrapper  # noqa: E402
from .runner import GCURunner  # noqa: E402


def _report_gcu_errors(previous=sys.excepthook):
    """Print an uncaught :class:`GCUError` as its message alone.

    Its message already says what was found, what was expected and the fix; the stack of
    a stock tools/train.py adds nothing. ``MMGCU_TRACEBACK=1`` keeps the traceback.
    """

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, GCUError) and not os.environ.get("MMGCU_TRACEBACK"):
            sys.stderr.write(f"\nmmgcu: {exc}\n")
        else:
            previous(exc_type, exc, tb)

    sys.excepthook = hook


_report_gcu_errors()

__all__ = [
    "GCUAmpOptimWrapper",
    "GCUDevicePlacementHook",
    "GCUDistributedDataParallel",
    "GCUEmptyCacheHook",
    "GCUError",
    "GCULogProcessor",
    "GCUOptimWrapper",
    "GCURunner",
    "GCUTestLoop",
    "GCUValLoop",
    "__version__",
    "get_backend",
]
