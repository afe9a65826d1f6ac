from .sync_bn import (
    GCUSyncBatchNorm,
    TorchCardGroup,
    convert_gcu_sync_batchnorm,
    revert_gcu_sync_batchnorm,
)
from .wrappers import GCUDistributedDataParallel

__all__ = [
    "GCUDistributedDataParallel",
    "GCUSyncBatchNorm",
    "TorchCardGroup",
    "convert_gcu_sync_batchnorm",
    "revert_gcu_sync_batchnorm",
]
