from .empty_cache import GCUEmptyCacheHook
from .placement import GCUDevicePlacementHook

__all__ = ["GCUDevicePlacementHook", "GCUEmptyCacheHook"]
