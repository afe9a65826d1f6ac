"""Which accelerator ``select_accelerator`` builds for ``env_cfg.device``, and why."""

import sys
import types

import pytest
import torch

from mmgcu.device import ALIASES, DEVICES, GCUError, select_accelerator
from mmgcu.device.fallback import CPUAccelerator, CUDAAccelerator
from mmgcu.device.gcu1 import GCU1Accelerator
from mmgcu.device.gcu2 import GCU2Accelerator
from tests import fakes


class _BrokenTorchGcuFinder:
    """Makes ``import torch_gcu`` fail the way a driver/ABI mismatch does."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch_gcu":
            raise RuntimeError("libtops.so: driver version mismatch")
        return None


@pytest.fixture
def no_gcu(monkeypatch):
    """Neither generation: ``import torch_gcu`` raises ImportError and torch.gcu is absent."""
    monkeypatch.setitem(sys.modules, "torch_gcu", None)
    monkeypatch.delattr(torch, "gcu", raising=False)


@pytest.fixture
def broken_import(monkeypatch):
    monkeypatch.delattr(torch, "gcu", raising=False)
    monkeypatch.delitem(sys.modules, "torch_gcu", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_BrokenTorchGcuFinder(), *sys.meta_path])


@pytest.fixture
def neither(monkeypatch):
    """torch_gcu imports but offers neither torch.gcu nor gcu_device."""
    monkeypatch.setitem(sys.modules, "torch_gcu", types.ModuleType("torch_gcu"))
    monkeypatch.delattr(torch, "gcu", raising=False)


@pytest.fixture
def gcu2(monkeypatch):
    return fakes.gcu2(monkeypatch)


@pytest.fixture
def gcu1(monkeypatch):
    return fakes.gcu1(monkeypatch)


@pytest.fixture
def with_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


# -- auto -------------------------------------------------------------------------------


def test_auto_picks_gcu2_when_torch_gcu_registers_torch_gcu(gcu2):
    accelerator = select_accelerator()
    assert isinstance(accelerator, GCU2Accelerator)
    assert accelerator.module is torch.gcu
    assert accelerator.description == "torch_gcu 2.5.0 (2.x, PrivateUse1 'gcu')"


def test_gcu2_is_preferred_when_gcu_device_exists_too(gcu2):
    sys.modules["torch_gcu"].gcu_device = lambda i: torch.device("xla", i)
    assert select_accelerator().kind == "gcu2"


def test_auto_picks_gcu1_when_torch_gcu_has_gcu_device(gcu1):
    accelerator = select_accelerator()
    assert isinstance(accelerator, GCU1Accelerator)
    assert accelerator.torch_gcu is sys.modules["torch_gcu"]
    assert accelerator.description == "torch_gcu 2.5.136 (1.x, XLA 'xla')"


def test_jit_mode_reaches_gcu1(gcu1):
    assert select_accelerator("gcu1", jit_mode="SYNC").summary()["jit_mode"] == "SYNC"


def test_gcu2_version_missing_is_reported_as_unknown(gcu2):
    del sys.modules["torch_gcu"].__version__
    assert select_accelerator().description.startswith("torch_gcu unknown (2.x")


def test_torch_gcu_attribute_alone_is_not_a_gcu(gcu2, monkeypatch):
    # torch.gcu left behind while torch_gcu itself fails to import: no GCU accelerator.
    monkeypatch.setitem(sys.modules, "torch_gcu", None)
    assert select_accelerator().kind == "cpu"


def test_import_error_falls_back_to_cpu_with_the_reason(no_gcu):
    accelerator = select_accelerator()
    assert isinstance(accelerator, CPUAccelerator)
    assert accelerator.description.startswith("torch_gcu is not importable (")
    assert accelerator.description.endswith("; " + CPUAccelerator.description)


def test_other_import_failure_is_reported_not_hidden(broken_import):
    accelerator = select_accelerator()
    assert accelerator.kind == "cpu"
    assert (
        "importing torch_gcu failed: RuntimeError: libtops.so: driver version mismatch"
        in accelerator.description
    )


def test_neither_generation_falls_back_with_the_reason(neither):
    accelerator = select_accelerator()
    assert accelerator.kind == "cpu"
    assert "neither 2.x (torch.gcu) nor 1.x (gcu_device)" in accelerator.description


def test_fallback_reason_does_not_leak_into_the_class(no_gcu):
    select_accelerator()
    assert CPUAccelerator().description == "no torch_gcu and no CUDA; running on the CPU"


def test_auto_falls_back_to_cuda_when_available(no_gcu, with_cuda):
    accelerator = select_accelerator("auto")
    assert isinstance(accelerator, CUDAAccelerator)
    assert "torch_gcu is not importable" in accelerator.description
    assert accelerator.description.endswith("no torch_gcu; CUDA found")
    assert CUDAAccelerator().description == "no torch_gcu; CUDA found"


def test_every_call_builds_a_new_accelerator(gcu2):
    """No cache and no global state: the runner calls it once and passes the result on."""
    first, second = select_accelerator(), select_accelerator()
    assert first is not second and first.kind == second.kind == "gcu2"


def test_a_new_call_sees_a_changed_environment(gcu2, monkeypatch):
    assert select_accelerator().kind == "gcu2"
    monkeypatch.setitem(sys.modules, "torch_gcu", None)
    assert select_accelerator().kind == "cpu"


# -- named kinds ----------------------------------------------------------------------------


def test_known_devices_and_aliases():
    assert DEVICES == ("auto", "gcu", "gcu2", "gcu1", "cuda", "cpu")
    assert ALIASES == {"v2": "gcu2", "legacy": "gcu1"}


def test_unknown_device_is_refused_with_the_choices():
    with pytest.raises(GCUError, match="'tpu' is not a known device") as err:
        select_accelerator("tpu")
    assert str(DEVICES) in str(err.value)
    assert "v2, legacy" in str(err.value)


def test_cpu_ignores_a_present_gcu(gcu2):
    accelerator = select_accelerator("cpu")
    assert isinstance(accelerator, CPUAccelerator)
    torch.gcu.device_count.assert_not_called()


def test_cuda_without_cuda_is_refused(gcu2):
    with pytest.raises(GCUError, match=r"torch\.cuda\.is_available\(\) is False"):
        select_accelerator("cuda")


def test_cuda_ignores_a_present_gcu(gcu2, with_cuda):
    assert isinstance(select_accelerator("cuda"), CUDAAccelerator)


@pytest.mark.parametrize("device", ["gcu", "gcu2", "v2"])
def test_gcu_or_gcu2_finds_gcu2(gcu2, device):
    assert isinstance(select_accelerator(device), GCU2Accelerator)


@pytest.mark.parametrize("device", ["gcu", "gcu1", "legacy"])
def test_gcu_or_gcu1_finds_gcu1(gcu1, device):
    assert isinstance(select_accelerator(device), GCU1Accelerator)


@pytest.mark.parametrize(
    "device, wanted",
    [
        ("gcu", "a GCU"),
        ("gcu2", "torch_gcu 2.x"),
        ("v2", "torch_gcu 2.x"),
        ("gcu1", "torch_gcu 1.x"),
        ("legacy", "torch_gcu 1.x"),
    ],
)
def test_gcu_without_torch_gcu_names_the_cause_and_the_fix(no_gcu, with_cuda, device, wanted):
    # Even with CUDA present a demanded GCU must not silently fall back.
    with pytest.raises(GCUError) as err:
        select_accelerator(device)
    message = str(err.value)
    assert f"demands {wanted} (env_cfg.device={device!r})" in message
    assert "torch_gcu is not importable" in message
    assert "env_cfg.device='auto'" in message


def test_gcu_with_an_unrecognised_torch_gcu_says_so(neither):
    with pytest.raises(GCUError, match=r"neither 2\.x \(torch\.gcu\) nor 1\.x"):
        select_accelerator("gcu")


def test_gcu_with_a_broken_torch_gcu_says_why(broken_import):
    with pytest.raises(GCUError, match="importing torch_gcu failed: RuntimeError"):
        select_accelerator("gcu")


def test_gcu2_on_gcu1_is_a_mismatch(gcu1):
    with pytest.raises(GCUError) as err:
        select_accelerator("v2")
    message = str(err.value)
    assert "demands torch_gcu 2.x (env_cfg.device='v2')" in message
    assert "torch_gcu 2.5.136 (1.x" in message  # what is installed instead


def test_gcu1_on_gcu2_is_a_mismatch(gcu2):
    with pytest.raises(GCUError) as err:
        select_accelerator("gcu1")
    message = str(err.value)
    assert "demands torch_gcu 1.x" in message
    assert "torch_gcu 2.5.0 (2.x" in message


def test_an_invalid_jit_mode_is_refused(gcu1):
    with pytest.raises(GCUError, match=r"env_cfg.gcu_jit_mode='FAST': use one of"):
        select_accelerator("gcu1", jit_mode="FAST")
