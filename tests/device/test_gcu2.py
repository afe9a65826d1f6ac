"""GCU2Accelerator: torch_gcu 2.x, PrivateUse1 ``gcu`` driven through ``torch.gcu``.

Most tests run over a mocked ``torch.gcu`` (:func:`tests.fakes.gcu2`); the last runs the
accelerator on the simulated torch_gcu 2.x in a fresh process.
"""

import os
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from mmgcu.device import GCUError
from tests import fakes
from tests.conftest import free_port, last_json, needs_torch2, run_program

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "accelerator_on_sim.py")


@pytest.fixture
def events():
    return []


@pytest.fixture
def accelerator(monkeypatch, events):
    return fakes.gcu2(monkeypatch, cards=8, current=0, events=events)


@pytest.fixture
def gcu(accelerator):
    """The mocked ``torch.gcu``."""
    return torch.gcu


def test_kind_attributes(accelerator):
    assert (accelerator.kind, accelerator.device_type, accelerator.is_gcu) == ("gcu2", "gcu", True)
    assert accelerator.lazy is False
    assert (accelerator.cudnn, accelerator.torch_sync_bn) == (False, False)
    # mmengine sends CPU tensors through the default group, so it needs gloo for CPU.
    assert accelerator.default_pg_backend == "cpu:gloo,gcu:eccl"
    assert accelerator.vendor_ddp() is torch.nn.parallel.DistributedDataParallel
    assert accelerator.amp_dtypes == (torch.float16, torch.bfloat16)
    assert accelerator.description == "torch_gcu 2.5.0 (2.x, PrivateUse1 'gcu')"


def test_is_available_returns_a_bool(accelerator, gcu):
    gcu.is_available.return_value = 1
    assert accelerator.is_available() is True
    gcu.is_available.return_value = 0
    assert accelerator.is_available() is False


def test_device_count_current_device_and_set_device(accelerator, gcu, events):
    gcu.device_count.return_value = 4
    assert accelerator.device_count() == 4
    accelerator.set_device(3)
    assert accelerator.current_device() == 3
    assert events == [("set_device", 3)]


def test_device_of_a_card(accelerator, gcu, gcu_device_type):
    assert accelerator.device(2) == torch.device("gcu", 2)
    gcu.current_device.assert_not_called()


def test_device_defaults_to_the_current_card(accelerator, gcu, gcu_device_type):
    accelerator.set_device(6)
    assert accelerator.device() == torch.device("gcu", 6)


def test_device_name(accelerator, gcu):
    assert accelerator.device_name(4) == "Enflame S60"
    gcu.get_device_name.assert_called_once_with(4)


def test_peak_memory_is_the_peak_since_the_last_call(accelerator, gcu):
    gcu.max_memory_allocated.return_value = 1024
    assert accelerator.peak_memory(2) == 1024
    gcu.max_memory_allocated.assert_called_once_with(2)
    gcu.reset_peak_memory_stats.assert_called_once_with(2)
    assert "since the last log line" in accelerator.memory_source


def test_empty_cache(accelerator, gcu):
    assert accelerator.caches_memory is True
    assert accelerator.empty_cache() is True
    gcu.empty_cache.assert_called_once_with()


def test_manual_seed_all(accelerator, gcu):
    accelerator.manual_seed_all(42)
    gcu.manual_seed_all.assert_called_once_with(42)


def test_ddp_kwargs_name_the_card(accelerator):
    assert accelerator.ddp_kwargs(3) == {"device_ids": [3], "output_device": 3}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_is_torch_autocast_on_gcu(accelerator, monkeypatch, dtype):
    autocast = mock.Mock()
    monkeypatch.setattr(torch, "autocast", autocast)
    assert accelerator.autocast(dtype=dtype, enabled=False) is autocast.return_value
    autocast.assert_called_once_with("gcu", dtype=dtype, enabled=False)


def test_autocast_refuses_other_dtypes(accelerator, monkeypatch):
    monkeypatch.setattr(torch, "autocast", mock.Mock())
    with pytest.raises(GCUError, match="not torch.float32"):
        accelerator.autocast(dtype=torch.float32)
    torch.autocast.assert_not_called()


@pytest.mark.skipif(
    not hasattr(getattr(torch, "amp", None), "GradScaler"),
    reason="torch.amp.GradScaler: torch >= 2.3 (torch_gcu 2.x needs torch 2.x)",
)
def test_grad_scaler_is_torch_amp_on_gcu(accelerator, monkeypatch):
    scaler = mock.Mock()
    monkeypatch.setattr(torch.amp, "GradScaler", scaler)
    assert accelerator.grad_scaler(init_scale=8.0) is scaler.return_value
    scaler.assert_called_once_with("gcu", init_scale=8.0)


def test_optimizer_step_is_a_plain_step(accelerator):
    optimizer = mock.Mock()
    accelerator.optimizer_step(optimizer, torch.nn.Linear(1, 1), torch.zeros(()), closure=None)
    optimizer.step.assert_called_once_with(closure=None)


def test_after_amp_step_does_nothing(accelerator):
    optimizer, scaler = mock.Mock(), mock.Mock()
    accelerator.after_amp_step(optimizer, torch.nn.Linear(1, 1), scaler, torch.zeros(()))
    assert optimizer.mock_calls == [] and scaler.mock_calls == []


def test_check_collectives_without_is_eccl_available(accelerator, monkeypatch):
    monkeypatch.delattr(dist, "is_eccl_available", raising=False)
    with pytest.raises(GCUError, match="ECCL is not available"):
        accelerator.check_collectives()


def test_check_collectives_when_eccl_is_unavailable(accelerator, monkeypatch):
    monkeypatch.setattr(dist, "is_eccl_available", lambda: False, raising=False)
    with pytest.raises(GCUError, match="Install the ECCL package"):
        accelerator.check_collectives()


def test_check_collectives_when_eccl_is_available(accelerator, monkeypatch):
    check = mock.Mock(return_value=True)
    monkeypatch.setattr(dist, "is_eccl_available", check, raising=False)
    accelerator.check_collectives()
    check.assert_called_once_with()


def test_summary(accelerator):
    assert accelerator.summary() == {
        "kind": "gcu2",
        "device_type": "gcu",
        "description": "torch_gcu 2.5.0 (2.x, PrivateUse1 'gcu')",
        "available": True,
        "cards": 8,
        "process_groups": "cpu:gloo,gcu:eccl",
        "memory": "peak allocated since the last log line (max_memory_allocated)",
    }


def test_summary_without_cards_does_not_count_them(accelerator, gcu):
    gcu.is_available.return_value = False
    facts = accelerator.summary()
    assert facts["available"] is False and facts["cards"] == 0
    gcu.device_count.assert_not_called()


@needs_torch2
def test_on_the_simulated_torch_gcu_2x():
    out = last_json(
        run_program(
            PROGRAM,
            MMGCU_SIMULATE=2,
            MMGCU_SIMULATE_API="gcu2",
            RANK=0,
            WORLD_SIZE=1,
            LOCAL_RANK=1,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=free_port(),
        ).stdout
    )
    assert (out["kind"], out["cards"], out["current"], out["device"]) == ("gcu2", 2, 1, "gcu:1")
    assert out["missing_card"].startswith("RuntimeError: GCU device ordinal 2 is invalid")
    # The peak since the last reading: the block is in the second reading, not the third.
    assert out["memory"] == [256 * 1024, 256 * 1024, 0]
    assert out["empty_cache"] is True
    assert out["group"] == ["torch.distributed cpu:gloo,gcu:eccl", 1, True]
    assert out["reduced"] == ["gcu:1", [2.0, 2.0, 2.0]]
    assert out["summary"]["process_groups"] == "cpu:gloo,gcu:eccl"
    assert out["step"] == {} and out["stepped"] is True  # no vendor call: a torch step
    assert out["amp_dtype"] == "torch.float16"
    assert out["amp_step"] == {} and out["amp_stepped"] is True
