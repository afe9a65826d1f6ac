from .checkpoint import CPUCheckpointHook
from .empty_cache import GCUEmptyCacheHook
from .placement import GCUDevicePlacementHook

__all__ = ["CPUCheckpointHook", "GCUDevicePlacementHook", "GCUEmptyCacheHook"]
