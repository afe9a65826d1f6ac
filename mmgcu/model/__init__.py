from .mmcv_ops import GCUPSAMask, convert_gcu_mmcv_ops
from .sync_bn import (
    GCUSyncBatchNorm,
    convert_gcu_sync_batchnorm,
    revert_gcu_sync_batchnorm,
)
from .wrappers import GCU1DistributedDataParallel, GCUDistributedDataParallel

__all__ = [
    "GCU1DistributedDataParallel",
    "GCUDistributedDataParallel",
    "GCUPSAMask",
    "GCUSyncBatchNorm",
    "convert_gcu_mmcv_ops",
    "convert_gcu_sync_batchnorm",
    "revert_gcu_sync_batchnorm",
]
