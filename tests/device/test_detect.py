"""Which backend ``detect`` and ``get_backend`` choose, and why."""

import sys

import pytest
import torch

from mmgcu.device import GENERATIONS, GCUError, detect, get_backend, reset_backend
from mmgcu.device.fallback import CpuBackend, CudaBackend
from mmgcu.device.legacy import GcuLegacyBackend
from mmgcu.device.v2 import GcuV2Backend

from .conftest import make_module


class _BrokenTorchGcuFinder:
    """Makes ``import torch_gcu`` fail the way a driver/ABI mismatch does."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch_gcu":
            raise RuntimeError("libtops.so: driver version mismatch")
        return None


@pytest.fixture
def broken_import(monkeypatch):
    monkeypatch.delattr(torch, "gcu", raising=False)
    monkeypatch.delitem(sys.modules, "torch_gcu", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_BrokenTorchGcuFinder(), *sys.meta_path])


@pytest.fixture
def neither(monkeypatch):
    """torch_gcu imports but offers neither torch.gcu nor gcu_device."""
    monkeypatch.setitem(sys.modules, "torch_gcu", make_module("torch_gcu"))
    monkeypatch.delattr(torch, "gcu", raising=False)


@pytest.fixture
def with_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


# -- auto detection ---------------------------------------------------------------


def test_auto_picks_v2_when_torch_gcu_is_registered(v2):
    backend = detect()
    assert isinstance(backend, GcuV2Backend)
    assert backend.torch_gcu is v2.torch_gcu
    assert backend.gcu is v2.gcu
    assert "2.5.0" in backend.description and "2.x" in backend.description


def test_v2_is_preferred_when_gcu_device_exists_too(v2):
    v2.torch_gcu.gcu_device = lambda i: f"xla:{i}"
    assert detect().name == "v2"


def test_auto_picks_legacy_when_torch_gcu_has_gcu_device(legacy):
    backend = detect()
    assert isinstance(backend, GcuLegacyBackend)
    assert backend.torch_gcu is legacy
    assert "1.10.0" in backend.description and "1.x" in backend.description


def test_missing_version_is_reported_as_unknown(legacy):
    del legacy.__version__
    assert "torch_gcu unknown" in detect().description


def test_torch_gcu_attribute_alone_is_not_a_gcu(v2, monkeypatch):
    # torch.gcu left behind while torch_gcu itself fails to import: no GCU backend.
    monkeypatch.setitem(sys.modules, "torch_gcu", None)
    assert detect().name == "cpu"


def test_import_error_falls_back_to_cpu_with_reason(no_gcu):
    backend = detect()
    assert isinstance(backend, CpuBackend)
    assert backend.description.startswith("torch_gcu is not importable (")
    assert backend.description.endswith("; " + CpuBackend.description)


def test_other_import_failure_is_reported_not_hidden(broken_import):
    backend = detect()
    assert backend.name == "cpu"
    assert (
        "importing torch_gcu failed: RuntimeError: libtops.so: driver version mismatch"
        in backend.description
    )


def test_neither_generation_falls_back_with_reason(neither):
    backend = detect()
    assert backend.name == "cpu"
    assert "neither 2.x (torch.gcu) nor 1.x (gcu_device)" in backend.description


def test_fallback_reason_does_not_leak_into_the_class(no_gcu):
    detect()
    assert CpuBackend().description == "no torch_gcu and no CUDA; running on the CPU"


def test_auto_falls_back_to_cuda_when_available(no_gcu, with_cuda):
    backend = detect("auto")
    assert isinstance(backend, CudaBackend)
    assert "torch_gcu is not importable" in backend.description
    assert backend.description.endswith("no torch_gcu; CUDA found")


# -- forced generations -----------------------------------------------------------


def test_unknown_generation_is_refused():
    with pytest.raises(GCUError, match="'tpu' is not a known device") as err:
        detect("tpu")
    assert str(GENERATIONS) in str(err.value)


def test_forced_cpu_ignores_a_present_gcu(v2):
    assert isinstance(detect("cpu"), CpuBackend)


def test_forced_cuda_without_cuda_is_refused(v2):
    with pytest.raises(GCUError, match=r"torch\.cuda\.is_available\(\) is False"):
        detect("cuda")


def test_forced_cuda_ignores_a_present_gcu(v2, with_cuda):
    assert isinstance(detect("cuda"), CudaBackend)


@pytest.mark.parametrize("generation", ["gcu", "v2"])
def test_forced_gcu_or_v2_finds_v2(v2, generation):
    assert isinstance(detect(generation), GcuV2Backend)


@pytest.mark.parametrize("generation", ["gcu", "legacy"])
def test_forced_gcu_or_legacy_finds_legacy(legacy, generation):
    assert isinstance(detect(generation), GcuLegacyBackend)


@pytest.mark.parametrize(
    "generation, wanted",
    [("gcu", "a GCU"), ("v2", "torch_gcu 2.x"), ("legacy", "torch_gcu 1.x")],
)
def test_forced_gcu_without_torch_gcu_names_the_cause_and_the_fix(
    no_gcu, with_cuda, generation, wanted
):
    # Even with CUDA present a forced GCU must not silently fall back.
    with pytest.raises(GCUError) as err:
        detect(generation)
    message = str(err.value)
    assert f"demands {wanted} (env_cfg.device={generation!r})" in message
    assert "torch_gcu is not importable" in message
    assert "env_cfg.device='auto'" in message


def test_forced_gcu_with_an_unrecognised_torch_gcu_says_so(neither):
    with pytest.raises(GCUError, match=r"neither 2\.x \(torch\.gcu\) nor 1\.x"):
        detect("gcu")


def test_forced_gcu_with_a_broken_torch_gcu_says_why(broken_import):
    with pytest.raises(GCUError, match="importing torch_gcu failed: RuntimeError"):
        detect("gcu")


def test_forced_v2_on_legacy_is_a_mismatch(legacy):
    with pytest.raises(GCUError) as err:
        detect("v2")
    message = str(err.value)
    assert "demands torch_gcu 2.x" in message
    assert "torch_gcu 1.10.0 (1.x" in message  # what is installed instead


def test_forced_legacy_on_v2_is_a_mismatch(v2):
    with pytest.raises(GCUError) as err:
        detect("legacy")
    message = str(err.value)
    assert "demands torch_gcu 1.x" in message
    assert "torch_gcu 2.5.0 (2.x" in message


# -- get_backend: cached per process --------------------------------------------


def test_get_backend_detects_once_and_caches(v2, monkeypatch):
    first = get_backend()
    monkeypatch.setitem(sys.modules, "torch_gcu", None)  # a new detect would find nothing
    assert get_backend() is first
    assert get_backend("auto") is first


@pytest.mark.parametrize("generation", ["gcu", "v2"])
def test_get_backend_keeps_a_cached_backend_that_matches(v2, generation):
    first = get_backend()
    assert get_backend(generation) is first


def test_get_backend_reselects_when_another_generation_is_named(v2):
    gcu = get_backend()
    cpu = get_backend("cpu")
    assert isinstance(cpu, CpuBackend)
    assert get_backend() is cpu  # the new choice is cached
    assert get_backend("v2") is not gcu and get_backend().name == "v2"


def test_get_backend_gcu_replaces_a_cached_fallback(monkeypatch, v2):
    monkeypatch.setitem(sys.modules, "torch_gcu", None)
    assert get_backend().name == "cpu"
    monkeypatch.setitem(sys.modules, "torch_gcu", v2.torch_gcu)
    assert get_backend("gcu").name == "v2"


def test_get_backend_keeps_the_old_backend_when_reselection_fails(v2):
    first = get_backend()
    with pytest.raises(GCUError):
        get_backend("legacy")
    assert get_backend() is first


def test_reset_backend_forgets_the_cache(v2):
    first = get_backend()
    reset_backend()
    second = get_backend()
    assert second is not first and second.name == "v2"
