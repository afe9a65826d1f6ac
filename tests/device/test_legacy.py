"""GcuLegacyBackend delegates to the ``torch_gcu`` 1.x module (XLA devices)."""

import sys
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from mmgcu.device import GCUError
from mmgcu.device.legacy import GcuLegacyBackend

from .conftest import FakeLegacyDDP, make_module

OPTIONAL = [
    "get_device_name",
    "sync_lived_tensor",
    "memory_allocated",
    "max_memory_allocated",
    "reset_peak_memory_stats",
    "empty_cache",
]


@pytest.fixture
def backend(legacy):
    return GcuLegacyBackend(legacy)


def test_generation_attributes(backend):
    assert backend.name == "legacy"
    assert backend.device_type == "xla"
    assert backend.is_gcu and backend.lazy_step
    assert not backend.supports_sync_bn and "SyncBatchNorm" in backend.sync_bn_reason
    # ASSUMED split: CPU collectives on gloo, card tensors on a separate ECCL group.
    assert backend.default_group_backend == "gloo"
    assert backend.device_group_backend == "eccl"


def test_is_available_returns_a_bool(backend, legacy):
    legacy.is_available.return_value = 0
    assert backend.is_available() is False
    legacy.is_available.return_value = 1
    assert backend.is_available() is True


def test_device_count_and_current_device(backend, legacy):
    legacy.device_count.return_value = 4
    legacy.current_device.return_value = 2
    assert backend.device_count() == 4
    assert backend.current_device() == 2


def test_set_device(backend, legacy):
    backend.set_device(5)
    legacy.set_device.assert_called_once_with(5)


def test_device_comes_from_gcu_device(backend, legacy):
    assert backend.device(3) == torch.device("xla", 3)
    legacy.gcu_device.assert_called_once_with(3)
    legacy.current_device.assert_not_called()


def test_device_defaults_to_the_current_card(backend, legacy):
    legacy.current_device.return_value = 7
    assert backend.device() == torch.device("xla", 7)
    legacy.gcu_device.assert_called_once_with(7)


def test_device_name_from_the_vendor(backend, legacy):
    legacy.get_device_name = mock.Mock(return_value="T20")
    assert backend.device_name(1) == "T20"
    legacy.get_device_name.assert_called_once_with(1)


def test_device_name_without_the_vendor_call(backend):
    assert backend.device_name(1) == "GCU"


def test_synchronize_flushes_the_current_card(backend, legacy):
    legacy.sync_lived_tensor = mock.Mock()
    legacy.current_device.return_value = 2
    backend.synchronize()
    legacy.sync_lived_tensor.assert_called_once_with(torch.device("xla", 2))


def test_synchronize_without_sync_lived_tensor_is_a_no_op(backend, legacy):
    backend.synchronize()  # the fake lacks it: a direct call would raise AttributeError
    legacy.gcu_device.assert_not_called()


@pytest.mark.parametrize("method", ["memory_allocated", "max_memory_allocated"])
def test_memory_statistics_from_the_vendor(backend, legacy, method):
    setattr(legacy, method, mock.Mock(return_value=2048))
    assert getattr(backend, method)(1) == 2048
    getattr(legacy, method).assert_called_once_with(1)


@pytest.mark.parametrize("method", ["memory_allocated", "max_memory_allocated"])
def test_memory_statistics_are_none_without_the_vendor_call(backend, method):
    assert getattr(backend, method)(0) is None


def test_reset_peak_and_empty_cache_from_the_vendor(backend, legacy):
    legacy.reset_peak_memory_stats = mock.Mock()
    legacy.empty_cache = mock.Mock()
    backend.reset_peak_memory_stats(3)
    backend.empty_cache()
    legacy.reset_peak_memory_stats.assert_called_once_with(3)
    legacy.empty_cache.assert_called_once_with()


def test_reset_peak_and_empty_cache_without_the_vendor_calls(backend, legacy):
    assert not any(hasattr(legacy, name) for name in OPTIONAL)
    assert backend.reset_peak_memory_stats(0) is None
    assert backend.empty_cache() is None


def test_manual_seed_all(backend, legacy):
    backend.manual_seed_all(1234)
    legacy.manual_seed_all.assert_called_once_with(1234)


def test_ddp_is_the_vendor_class_without_device_ids(backend):
    assert backend.ddp_class() is FakeLegacyDDP
    assert backend.ddp_device_kwargs(3) == {}


def test_import_distributed_imports_torch_gcu_distributed(backend, monkeypatch):
    gcu_dist = make_module("torch_gcu.distributed")
    monkeypatch.setitem(sys.modules, "torch_gcu.distributed", gcu_dist)
    assert backend.import_distributed() is dist
    backend.check_dist_backend()


def test_import_distributed_failure_is_a_gcu_error(backend, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_gcu.distributed", None)  # import raises
    with pytest.raises(GCUError, match="'import torch_gcu.distributed' failed") as err:
        backend.import_distributed()
    assert isinstance(err.value.__cause__, ImportError)


def test_check_dist_backend_fails_when_eccl_cannot_be_imported(backend, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_gcu.distributed", None)
    with pytest.raises(GCUError, match="ECCL is not available"):
        backend.check_dist_backend()


def test_autocast_is_the_vendor_autocast(backend, legacy):
    assert backend.autocast(torch.float16, enabled=False) is legacy.amp.autocast.return_value
    legacy.amp.autocast.assert_called_once_with(enabled=False, dtype=torch.float16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_autocast_refuses_anything_but_float16(backend, legacy, dtype):
    with pytest.raises(GCUError, match="supports only float16"):
        backend.autocast(dtype)
    legacy.amp.autocast.assert_not_called()


def test_grad_scaler_is_the_vendor_scaler(backend, legacy):
    assert backend.grad_scaler(init_scale=4.0) is legacy.amp.GradScaler.return_value
    legacy.amp.GradScaler.assert_called_once_with(use_zero_grad=True, init_scale=4.0)


def test_optimizer_step_runs_the_lazy_graph_once(backend, legacy):
    optimizer = mock.Mock()
    model = object()
    a, b = object(), object()
    backend.optimizer_step(optimizer, tensors=(a, b), model=model, closure=None)
    legacy.optimizer_step.assert_called_once_with(
        optimizer, [a, b], mode=legacy.JitRunMode.SAFEASYNC, model=model, closure=None
    )
    optimizer.step.assert_not_called()  # the vendor call steps; a second step would double it


def test_facts(backend, legacy):
    assert backend.facts() == {
        "generation": "legacy",
        "device_type": "xla",
        "description": "torch_gcu 1.10.0 (1.x, XLA 'xla')",
        "available": True,
        "cards": 8,
        "dist_backend": "gloo + eccl",
    }
