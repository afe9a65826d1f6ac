"""The device tests run without CUDA, whatever this machine has."""

import pytest
import torch


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    """Fallback choices must not depend on whether this machine has CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def gcu_device_type():
    """Let ``torch.device('gcu', i)`` parse, as torch_gcu 2.x does on import.

    Renaming PrivateUse1 cannot be undone; 'gcu' is the name torch_gcu and mmgcu.sim use.
    """
    if not hasattr(torch.utils, "rename_privateuse1_backend"):
        pytest.skip("torch < 2.0 cannot name PrivateUse1 (torch_gcu 2.x needs torch 2.x)")
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", "gcu"):
        pytest.skip(f"PrivateUse1 is already named {name!r} in this process")
    if name != "gcu":
        torch.utils.rename_privateuse1_backend("gcu")
