"""Models torch_gcu/nn/parallel of a 1.x release."""

from .distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
