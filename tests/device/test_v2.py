"""GcuV2Backend delegates to ``torch.gcu`` (torch_gcu 2.x)."""

from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mmgcu.device import GCUError
from mmgcu.device.v2 import GcuV2Backend


@pytest.fixture
def backend(v2):
    return GcuV2Backend(v2.torch_gcu)


def test_generation_attributes(backend):
    assert backend.name == "v2"
    assert backend.device_type == "gcu"
    assert backend.is_gcu and backend.supports_sync_bn and not backend.lazy_step
    # mmengine sends CPU tensors through the default group, so it needs gloo for CPU.
    assert backend.default_group_backend == "cpu:gloo,gcu:eccl"
    assert backend.device_group_backend is None


def test_is_available_returns_a_bool(backend, v2):
    v2.gcu.is_available.return_value = 1
    assert backend.is_available() is True
    v2.gcu.is_available.return_value = 0
    assert backend.is_available() is False


def test_device_count_and_current_device(backend, v2):
    v2.gcu.device_count.return_value = 8
    v2.gcu.current_device.return_value = 5
    assert backend.device_count() == 8
    assert backend.current_device() == 5
    v2.gcu.device_count.assert_called_once_with()


def test_set_device(backend, v2):
    backend.set_device(3)
    v2.gcu.set_device.assert_called_once_with(3)


def test_device_of_a_card(backend, v2, gcu_device_type):
    assert backend.device(2) == torch.device("gcu", 2)
    v2.gcu.current_device.assert_not_called()


def test_device_defaults_to_the_current_card(backend, v2, gcu_device_type):
    v2.gcu.current_device.return_value = 6
    assert backend.device() == torch.device("gcu", 6)


def test_device_name(backend, v2):
    v2.gcu.get_device_name.return_value = "Enflame S60"
    assert backend.device_name(4) == "Enflame S60"
    v2.gcu.get_device_name.assert_called_once_with(4)


def test_synchronize(backend, v2):
    backend.synchronize()
    v2.gcu.synchronize.assert_called_once_with()


@pytest.mark.parametrize("method", ["memory_allocated", "max_memory_allocated"])
@pytest.mark.parametrize("index", [None, 2])
def test_memory_statistics(backend, v2, method, index):
    getattr(v2.gcu, method).return_value = 1024
    assert getattr(backend, method)(index) == 1024
    getattr(v2.gcu, method).assert_called_once_with(index)


def test_reset_peak_memory_stats(backend, v2):
    backend.reset_peak_memory_stats(1)
    v2.gcu.reset_peak_memory_stats.assert_called_once_with(1)


def test_empty_cache(backend, v2):
    backend.empty_cache()
    v2.gcu.empty_cache.assert_called_once_with()


def test_manual_seed_all(backend, v2):
    backend.manual_seed_all(42)
    v2.gcu.manual_seed_all.assert_called_once_with(42)


def test_ddp_is_torch_ddp_with_device_ids(backend):
    assert backend.ddp_class() is DistributedDataParallel
    assert backend.ddp_device_kwargs(3) == {"device_ids": [3], "output_device": 3}


def test_import_distributed_is_torch_distributed(backend):
    assert backend.import_distributed() is dist


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_uses_torch_autocast_on_gcu(backend, monkeypatch, dtype):
    autocast = mock.Mock()
    monkeypatch.setattr(torch, "autocast", autocast)
    assert backend.autocast(dtype=dtype, enabled=False) is autocast.return_value
    autocast.assert_called_once_with("gcu", dtype=dtype, enabled=False)


def test_autocast_refuses_other_dtypes(backend, monkeypatch):
    monkeypatch.setattr(torch, "autocast", mock.Mock())
    with pytest.raises(GCUError, match="not torch.float32"):
        backend.autocast(dtype=torch.float32)
    torch.autocast.assert_not_called()


def test_grad_scaler_is_torch_amp_on_gcu(backend, monkeypatch):
    scaler = mock.Mock()
    monkeypatch.setattr(torch.amp, "GradScaler", scaler)
    assert backend.grad_scaler(init_scale=8.0) is scaler.return_value
    scaler.assert_called_once_with("gcu", init_scale=8.0)


def test_optimizer_step_is_a_plain_step(backend, v2):
    optimizer = mock.Mock()
    closure = object()
    backend.optimizer_step(optimizer, tensors=[object()], model=object(), closure=closure)
    optimizer.step.assert_called_once_with(closure=closure)
    v2.torch_gcu.optimizer_step.assert_not_called()


def test_check_dist_backend_without_is_eccl_available(backend, monkeypatch):
    monkeypatch.delattr(dist, "is_eccl_available", raising=False)
    with pytest.raises(GCUError, match="ECCL is not available"):
        backend.check_dist_backend()


def test_check_dist_backend_when_eccl_is_unavailable(backend, monkeypatch):
    monkeypatch.setattr(dist, "is_eccl_available", lambda: False, raising=False)
    with pytest.raises(GCUError, match="Install the ECCL package"):
        backend.check_dist_backend()


def test_check_dist_backend_when_eccl_is_available(backend, monkeypatch):
    check = mock.Mock(return_value=True)
    monkeypatch.setattr(dist, "is_eccl_available", check, raising=False)
    backend.check_dist_backend()
    check.assert_called_once_with()


def test_facts(backend, v2):
    v2.gcu.is_available.return_value = True
    v2.gcu.device_count.return_value = 8
    assert backend.facts() == {
        "generation": "v2",
        "device_type": "gcu",
        "description": "torch_gcu 2.5.0 (2.x, PrivateUse1 'gcu')",
        "available": True,
        "cards": 8,
        "dist_backend": "cpu:gloo,gcu:eccl",
    }


def test_facts_without_cards_does_not_count_them(backend, v2):
    v2.gcu.is_available.return_value = False
    facts = backend.facts()
    assert facts["available"] is False and facts["cards"] == 0
    v2.gcu.device_count.assert_not_called()
