"""Fake torch_gcu generations and recording DDP classes, for the runner, wrapper and hook tests.

Each ``install_*`` helper builds a real mmgcu backend over a fake torch_gcu (or a mocked
torch.cuda), makes it the process's backend through ``monkeypatch`` and returns it. Card
choices are appended to ``events`` (as ``("set_device", index)``), so a test can check the
order of set-up calls. ``on_cpu=True`` makes the backend's ``device()`` a recording mock that
answers ``torch.device('cpu')``, so real modules pass the wrapper's placement check.
"""

import sys
import types
from types import SimpleNamespace
from unittest import mock

import torch
from torch.nn.parallel import DistributedDataParallel

from mmgcu import device as mdevice
from mmgcu.device.fallback import CpuBackend, CudaBackend
from mmgcu.device.legacy import GcuLegacyBackend
from mmgcu.device.v2 import GcuV2Backend

#: What torch_gcu 2.x puts on ``torch.gcu`` and the backend uses.
V2_API = [
    "is_available",
    "device_count",
    "current_device",
    "set_device",
    "synchronize",
    "memory_allocated",
    "max_memory_allocated",
    "reset_peak_memory_stats",
    "empty_cache",
    "manual_seed_all",
    "get_device_name",
]


class VendorDDP(DistributedDataParallel):
    """Stands for ``torch_gcu.nn.parallel.DistributedDataParallel`` (a torch DDP subclass).

    It records its arguments and never calls torch DDP's ``__init__``, so no process group
    is needed.
    """

    def __init__(self, module, **kwargs):
        torch.nn.Module.__init__(self)
        self.module = module
        self.ddp_kwargs = kwargs


def record_torch_ddp(monkeypatch):
    """Replace torch DDP's ``__init__`` by a recorder; returns the list of its kwargs."""
    calls = []

    def fake_init(self, module, **kwargs):
        torch.nn.Module.__init__(self)
        self.module = module
        self.ddp_kwargs = kwargs
        calls.append(kwargs)

    monkeypatch.setattr(DistributedDataParallel, "__init__", fake_init)
    return calls


class _Cards:
    """The current card of a fake runtime; ``set`` records the choice in ``events``."""

    def __init__(self, current, events):
        self.current = current
        self.events = events if events is not None else []

    def set(self, index):
        self.events.append(("set_device", index))
        self.current = index

    def get(self):
        return self.current


def use_backend(monkeypatch, backend):
    """Make ``backend`` what ``mmgcu.device.get_backend()`` returns."""
    monkeypatch.setattr(mdevice, "_backend", backend)
    return backend


def _on_cpu(monkeypatch, backend):
    monkeypatch.setattr(backend, "device", mock.Mock(return_value=torch.device("cpu")))


def install_v2(monkeypatch, cards=8, current=0, events=None, on_cpu=False, eccl=True):
    """torch_gcu 2.x with ``cards`` cards; ``eccl`` gives torch.distributed ECCL."""
    state = _Cards(current, events)
    gcu = mock.Mock(spec=V2_API)
    gcu.is_available.return_value = True
    gcu.device_count.return_value = cards
    gcu.current_device.side_effect = state.get
    gcu.set_device.side_effect = state.set
    torch_gcu = types.ModuleType("torch_gcu")
    torch_gcu.__version__ = "2.5.0"
    monkeypatch.setitem(sys.modules, "torch_gcu", torch_gcu)
    monkeypatch.setattr(torch, "gcu", gcu, raising=False)
    if eccl:
        monkeypatch.setattr(torch.distributed, "is_eccl_available", lambda: True, raising=False)
    else:
        monkeypatch.delattr(torch.distributed, "is_eccl_available", raising=False)
    backend = GcuV2Backend(torch_gcu)
    if on_cpu:
        _on_cpu(monkeypatch, backend)
    return use_backend(monkeypatch, backend)


def install_legacy(monkeypatch, cards=8, current=0, events=None, on_cpu=False, ddp=VendorDDP):
    """torch_gcu 1.x with ``cards`` cards (``xla:N``), its ECCL module and DDP class ``ddp``."""
    state = _Cards(current, events)
    torch_gcu = types.ModuleType("torch_gcu")
    torch_gcu.__dict__.update(
        __version__="1.10.0",
        is_available=mock.Mock(return_value=True),
        device_count=mock.Mock(return_value=cards),
        current_device=mock.Mock(side_effect=state.get),
        set_device=mock.Mock(side_effect=state.set),
        gcu_device=mock.Mock(side_effect=lambda i: f"xla:{i}"),
        manual_seed_all=mock.Mock(),
        nn=SimpleNamespace(parallel=SimpleNamespace(DistributedDataParallel=ddp)),
    )
    gcu_dist = types.ModuleType("torch_gcu.distributed")
    torch_gcu.distributed = gcu_dist
    monkeypatch.setitem(sys.modules, "torch_gcu", torch_gcu)
    monkeypatch.setitem(sys.modules, "torch_gcu.distributed", gcu_dist)
    monkeypatch.delattr(torch, "gcu", raising=False)
    backend = GcuLegacyBackend(torch_gcu)
    if on_cpu:
        _on_cpu(monkeypatch, backend)
    return use_backend(monkeypatch, backend)


def install_cuda(monkeypatch, cards=8, current=0, events=None, on_cpu=False):
    """A mocked torch.cuda with ``cards`` devices; ``torch.cuda.set_device`` is recorded."""
    state = _Cards(current, events)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cards)
    monkeypatch.setattr(torch.cuda, "current_device", state.get)
    monkeypatch.setattr(torch.cuda, "set_device", mock.Mock(side_effect=state.set))
    backend = CudaBackend()
    if on_cpu:
        _on_cpu(monkeypatch, backend)
    return use_backend(monkeypatch, backend)


def install_cpu(monkeypatch, events=None, on_cpu=False):
    """The CPU fallback (``on_cpu`` only adds the recording ``device()``)."""
    backend = CpuBackend()
    if on_cpu:
        _on_cpu(monkeypatch, backend)
    return use_backend(monkeypatch, backend)


INSTALL = {
    "v2": install_v2,
    "legacy": install_legacy,
    "cuda": install_cuda,
    "cpu": install_cpu,
}


class ConvBN(torch.nn.Module):
    """A small model with a BatchNorm (which SyncBN conversion replaces)."""

    def __init__(self, sync=False):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        norm = torch.nn.SyncBatchNorm if sync else torch.nn.BatchNorm2d
        self.bn = norm(4)

    def forward(self, x):
        return self.bn(self.conv(x))


def norm_types(model):
    """The classes of the normalisation layers of ``model``."""
    return [type(m) for m in model.modules() if "Norm" in type(m).__name__]
