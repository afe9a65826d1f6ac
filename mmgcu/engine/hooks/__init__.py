from .compile_watch import GCUCompileWatchHook
from .empty_cache import GCUEmptyCacheHook
from .placement import GCUDevicePlacementHook
from .runtime_info import GCURuntimeInfoHook
from .watchdog import GCUWatchdogHook

__all__ = [
    "GCUCompileWatchHook",
    "GCUWatchdogHook",
    "GCUDevicePlacementHook",
    "GCUEmptyCacheHook",
    "GCURuntimeInfoHook",
]
