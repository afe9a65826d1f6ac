"""No torch_gcu: CUDAAccelerator over torch.cuda, and CPUAccelerator."""

from unittest import mock

import pytest
import torch

from mmgcu.device import GCUError
from mmgcu.device.fallback import CPUAccelerator, CUDAAccelerator

# (accelerator method, its arguments, the torch.cuda function, its answer, the method's)
CUDA_QUERIES = [
    ("is_available", (), "is_available", 1, True),
    ("device_count", (), "device_count", 8, 8),
    ("current_device", (), "current_device", 3, 3),
    ("device_name", (1,), "get_device_name", "A100", "A100"),
]
CUDA_ACTIONS = [
    ("set_device", (2,), "set_device"),
    ("manual_seed_all", (7,), "manual_seed_all"),
]


@pytest.mark.parametrize("method, args, cuda_fn, given, expected", CUDA_QUERIES)
def test_cuda_answers_from_torch_cuda(monkeypatch, method, args, cuda_fn, given, expected):
    fn = mock.Mock(return_value=given)
    monkeypatch.setattr(torch.cuda, cuda_fn, fn)
    answer = getattr(CUDAAccelerator(), method)(*args)
    assert answer == expected and type(answer) is type(expected)
    fn.assert_called_once_with(*args)


@pytest.mark.parametrize("method, args, cuda_fn", CUDA_ACTIONS)
def test_cuda_acts_through_torch_cuda(monkeypatch, method, args, cuda_fn):
    fn = mock.Mock()
    monkeypatch.setattr(torch.cuda, cuda_fn, fn)
    getattr(CUDAAccelerator(), method)(*args)
    fn.assert_called_once_with(*args)


def test_cuda_attributes():
    accelerator = CUDAAccelerator()
    assert (accelerator.kind, accelerator.device_type) == ("cuda", "cuda")
    assert accelerator.is_gcu is False
    assert accelerator.default_pg_backend == "nccl"
    assert accelerator.vendor_ddp() is torch.nn.parallel.DistributedDataParallel
    assert accelerator.amp_dtypes == (torch.float16, torch.bfloat16)
    assert accelerator.ddp_kwargs(1) == {"device_ids": [1], "output_device": 1}
    # cuDNN and torch's SyncBatchNorm kernels are CUDA's.
    assert (accelerator.cudnn, accelerator.torch_sync_bn) == (True, True)


def test_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert CUDAAccelerator().device() == torch.device("cuda", 3)
    assert CUDAAccelerator().device(1) == torch.device("cuda", 1)


def test_cuda_peak_memory_resets_the_peak(monkeypatch):
    peak, reset = mock.Mock(return_value=4096), mock.Mock()
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", peak)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    accelerator = CUDAAccelerator()
    assert accelerator.peak_memory(1) == 4096
    peak.assert_called_once_with(1)
    reset.assert_called_once_with(1)
    assert "max_memory_allocated" in accelerator.memory_source


def test_cuda_empty_cache(monkeypatch):
    empty = mock.Mock()
    monkeypatch.setattr(torch.cuda, "empty_cache", empty)
    assert CUDAAccelerator().caches_memory is True
    assert CUDAAccelerator().empty_cache() is True
    empty.assert_called_once_with()


def test_cuda_autocast_and_grad_scaler(monkeypatch):
    autocast, scaler = mock.Mock(), mock.Mock()
    monkeypatch.setattr(torch.cuda.amp, "autocast", autocast)
    monkeypatch.setattr(torch.cuda.amp, "GradScaler", scaler)
    accelerator = CUDAAccelerator()
    assert accelerator.autocast(torch.bfloat16, enabled=False) is autocast.return_value
    autocast.assert_called_once_with(enabled=False, dtype=torch.bfloat16)
    assert accelerator.grad_scaler(init_scale=2.0) is scaler.return_value
    scaler.assert_called_once_with(init_scale=2.0)


def test_cuda_step_is_a_plain_step():
    optimizer = mock.Mock()
    CUDAAccelerator().optimizer_step(optimizer, torch.nn.Linear(1, 1), torch.zeros(()), closure=1)
    optimizer.step.assert_called_once_with(closure=1)


def test_cpu_has_one_card():
    accelerator = CPUAccelerator()
    assert (accelerator.kind, accelerator.device_type, accelerator.is_gcu) == ("cpu", "cpu", False)
    assert accelerator.is_available() is True
    assert accelerator.device_count() == 1
    assert accelerator.current_device() == 0
    assert accelerator.set_device(0) is None
    assert accelerator.device() == torch.device("cpu")
    assert accelerator.device(3) == torch.device("cpu")
    assert accelerator.device_name() == "cpu"
    assert (accelerator.lazy, accelerator.cudnn, accelerator.torch_sync_bn) == (False, False, False)


def test_cpu_reports_no_memory_and_has_no_cache():
    accelerator = CPUAccelerator()
    assert accelerator.peak_memory(0) is None
    assert accelerator.memory_source.startswith("none")
    assert accelerator.caches_memory is False
    assert accelerator.empty_cache() is False
    assert accelerator.manual_seed_all(1) is None
    assert accelerator.check_collectives() is None


def test_cpu_ddp_and_groups():
    accelerator = CPUAccelerator()
    assert accelerator.default_pg_backend == "gloo"
    assert accelerator.vendor_ddp() is torch.nn.parallel.DistributedDataParallel
    assert accelerator.ddp_kwargs(0) == {}


@pytest.mark.parametrize("call", ["autocast", "grad_scaler"])
def test_cpu_has_no_mixed_precision(call):
    with pytest.raises(GCUError, match="not available on cpu"):
        getattr(CPUAccelerator(), call)()
    assert CPUAccelerator.amp_dtypes == ()


def test_cpu_summary():
    assert CPUAccelerator().summary() == {
        "kind": "cpu",
        "device_type": "cpu",
        "description": "no torch_gcu and no CUDA; running on the CPU",
        "available": True,
        "cards": 1,
        "process_groups": "gloo",
        "memory": "none: this device reports no memory statistics",
    }
