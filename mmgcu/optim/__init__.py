from .wrappers import GCUAmpOptimWrapper, GCUOptimWrapper

__all__ = ["GCUAmpOptimWrapper", "GCUOptimWrapper"]
