from .checkpoint import CPUCheckpointHook, GCUCheckpointHook
from .empty_cache import GCUEmptyCacheHook
from .placement import GCUDevicePlacementHook
from .runtime_info import GCURuntimeInfoHook

__all__ = [
    "CPUCheckpointHook",
    "GCUCheckpointHook",
    "GCUDevicePlacementHook",
    "GCUEmptyCacheHook",
    "GCURuntimeInfoHook",
]
