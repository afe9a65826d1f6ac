from .checkpoint import CPUCheckpointHook, GCUCheckpointHook
from .empty_cache import GCUEmptyCacheHook
from .placement import GCUDevicePlacementHook

__all__ = ["CPUCheckpointHook", "GCUCheckpointHook", "GCUDevicePlacementHook", "GCUEmptyCacheHook"]
