"""The simulated torch_gcu 2.x: PyTorch's PrivateUse1 backend renamed ``gcu``.

What the torch_gcu 2.x README and its public op list show, and this package models: cards
are ``gcu:N``; importing torch_gcu registers ``torch.gcu`` (a ``torch.cuda`` look-alike)
and the ``eccl`` backend of torch.distributed for ``gcu`` tensors only, so a group that
must also carry CPU tensors is ``'cpu:gloo,gcu:eccl'``; autocast and GradScaler are
torch's own for ``'gcu'``. ``mmgcu.sim.install`` registers this package as ``torch_gcu``.
"""

import torch

from .. import eccl_installed, missing_kernels
from . import eccl, gcu

__simulated__ = True
__version__ = f"{torch.__version__.split('+')[0]}+sim"


def install() -> None:
    """What importing torch_gcu 2.x does to torch."""
    torch.utils.rename_privateuse1_backend("gcu")
    missing_kernels.register("PrivateUse1")
    torch._register_device_module("gcu", gcu)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=False)
    if eccl_installed():
        eccl.register("gcu")
    # torch_gcu 2.x adds this to torch.distributed; the simulator does what it does.
    torch.distributed.is_eccl_available = eccl_installed
