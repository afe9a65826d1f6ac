"""Fake torch_gcu modules of both generations, so the device layer is tested without a card."""

import sys
import types
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from mmgcu import device
from tests.model.fakes import V2_API


class FakeLegacyDDP(torch.nn.Module):
    """Stands for ``torch_gcu.nn.parallel.DistributedDataParallel``."""


def make_module(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


@pytest.fixture(autouse=True)
def fresh_backend():
    device.reset_backend()
    yield
    device.reset_backend()


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    """Fallback tests must not depend on whether this machine has CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def no_gcu(monkeypatch):
    """Neither generation: ``import torch_gcu`` raises ImportError and torch.gcu is absent."""
    monkeypatch.setitem(sys.modules, "torch_gcu", None)
    monkeypatch.delattr(torch, "gcu", raising=False)


@pytest.fixture
def v2(monkeypatch):
    """torch_gcu 2.x: the package imports and registers ``torch.gcu``."""
    gcu = mock.Mock(spec=V2_API)
    # v2 steps with optimizer.step(); the vendor call is here only to prove it is unused.
    torch_gcu = make_module("torch_gcu", __version__="2.5.0", optimizer_step=mock.Mock())
    monkeypatch.setitem(sys.modules, "torch_gcu", torch_gcu)
    monkeypatch.setattr(torch, "gcu", gcu, raising=False)
    return SimpleNamespace(torch_gcu=torch_gcu, gcu=gcu)


@pytest.fixture
def legacy(monkeypatch):
    """torch_gcu 1.x: no torch.gcu; cards are ``xla:N`` from ``gcu_device``.

    Only the mandatory API is present; tests add the optional functions they need.
    """
    torch_gcu = make_module(
        "torch_gcu",
        __version__="1.10.0",
        is_available=mock.Mock(return_value=True),
        device_count=mock.Mock(return_value=8),
        current_device=mock.Mock(return_value=0),
        set_device=mock.Mock(),
        gcu_device=mock.Mock(side_effect=lambda i: f"xla:{i}"),
        manual_seed_all=mock.Mock(),
        optimizer_step=mock.Mock(),
        JitRunMode=SimpleNamespace(SAFEASYNC=object(), SYNC=object(), ASYNC=object()),
        amp=mock.Mock(spec=["autocast", "GradScaler"]),
        nn=SimpleNamespace(parallel=SimpleNamespace(DistributedDataParallel=FakeLegacyDDP)),
    )
    monkeypatch.setitem(sys.modules, "torch_gcu", torch_gcu)
    monkeypatch.delattr(torch, "gcu", raising=False)
    return torch_gcu


@pytest.fixture
def gcu_device_type():
    """Let ``torch.device('gcu', i)`` parse, as torch_gcu 2.x does on import.

    Renaming PrivateUse1 cannot be undone; 'gcu' is the name torch_gcu and mmgcu.sim use.
    """
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", "gcu"):
        pytest.skip(f"PrivateUse1 is already named {name!r} in this process")
    if name != "gcu":
        torch.utils.rename_privateuse1_backend("gcu")
