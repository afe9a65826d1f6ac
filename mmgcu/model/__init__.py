from .wrappers import GCUDistributedDataParallel

__all__ = ["GCUDistributedDataParallel"]
