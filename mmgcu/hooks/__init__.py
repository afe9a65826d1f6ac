from .placement import GCUDevicePlacementHook

__all__ = ["GCUDevicePlacementHook"]
