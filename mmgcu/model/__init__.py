from .wrappers import GCU1DistributedDataParallel, GCUDistributedDataParallel

__all__ = ["GCU1DistributedDataParallel", "GCUDistributedDataParallel"]
