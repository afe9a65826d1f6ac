"""Kernels no GCU generation has, refused on simulated cards as the hardware would.

torch's ``SyncBatchNorm`` runs ``batch_norm_stats``, ``batch_norm_gather_stats_with_counts``,
``batch_norm_elemt``, ``batch_norm_backward_reduce`` and ``batch_norm_backward_elemt``.
torch_gcu 1.x has no SyncBatchNorm kernel; torch_gcu 2.x's public op list
(``codegen/gcu_native_functions.yaml``) has ``native_batch_norm`` but none of these, and
its CPU fallback cannot run them either (PyTorch has them for CUDA only). Strictest
reading: no GCU generation has them, so a simulated card refuses them with a message that
names mmgcu's own SyncBN. On torch 1.10 (no Python operator registration) the card's
fallback fails on them with PyTorch's own "Could not run ... with arguments from the 'CPU'
backend", which is as loud.
"""

import torch

OPS = (
    "batch_norm_stats",
    "batch_norm_gather_stats_with_counts",
    "batch_norm_elemt",
    "batch_norm_backward_reduce",
    "batch_norm_backward_elemt",
)
_LIBRARIES = []


def _refusal(op: str):
    def refuse(*args, **kwargs):
        raise NotImplementedError(
            f"simulated torch_gcu: no kernel for aten::{op} on GCU cards (torch's "
            "SyncBatchNorm needs it; no torch_gcu generation has it). mmgcu puts "
            "GCUSyncBatchNorm (norm_cfg type 'GCUSyncBN') in place of SyncBN layers."
        )

    return refuse


def register(dispatch_key: str) -> None:
    """Refuse the ops for one device's dispatch key ('PrivateUse1' or 'XLA')."""
    library = getattr(torch, "library", None)
    if library is None or not hasattr(library, "Library"):  # torch 1.10
        return
    lib = library.Library("aten", "IMPL")
    for op in OPS:
        lib.impl(op, _refusal(op), dispatch_key)
    _LIBRARIES.append(lib)  # a Library unregisters its kernels when collected
