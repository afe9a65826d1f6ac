from .checkpoint import CPUCheckpointHook
from .empty_cache import GCUEmptyCacheHook
from .placement import GCUDevicePlacementHook
from .runtime_info import GCURuntimeInfoHook

__all__ = [
    "CPUCheckpointHook",
    "GCUDevicePlacementHook",
    "GCUEmptyCacheHook",
    "GCURuntimeInfoHook",
]
