"""The CUDA and CPU fallbacks, and the defaults of DeviceBackend itself."""

from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mmgcu.device import DeviceBackend, GCUError
from mmgcu.device.fallback import CpuBackend, CudaBackend

# (backend method, its arguments, the torch.cuda function it must call with them)
CUDA_QUERIES = [
    ("is_available", (), "is_available"),
    ("device_count", (), "device_count"),
    ("current_device", (), "current_device"),
    ("device_name", (1,), "get_device_name"),
    ("memory_allocated", (1,), "memory_allocated"),
    ("max_memory_allocated", (None,), "max_memory_allocated"),
]
CUDA_ACTIONS = [
    ("set_device", (2,), "set_device"),
    ("synchronize", (), "synchronize"),
    ("reset_peak_memory_stats", (3,), "reset_peak_memory_stats"),
    ("empty_cache", (), "empty_cache"),
    ("manual_seed_all", (7,), "manual_seed_all"),
]


@pytest.mark.parametrize("method, args, cuda_fn", CUDA_QUERIES)
def test_cuda_answers_from_torch_cuda(monkeypatch, method, args, cuda_fn):
    fn = mock.Mock()
    monkeypatch.setattr(torch.cuda, cuda_fn, fn)
    assert getattr(CudaBackend(), method)(*args) is fn.return_value
    fn.assert_called_once_with(*args)


@pytest.mark.parametrize("method, args, cuda_fn", CUDA_ACTIONS)
def test_cuda_acts_through_torch_cuda(monkeypatch, method, args, cuda_fn):
    fn = mock.Mock()
    monkeypatch.setattr(torch.cuda, cuda_fn, fn)
    getattr(CudaBackend(), method)(*args)
    fn.assert_called_once_with(*args)


def test_cuda_attributes_and_ddp():
    backend = CudaBackend()
    assert (backend.name, backend.device_type, backend.is_gcu) == ("cuda", "cuda", False)
    assert backend.default_group_backend == "nccl" and backend.device_group_backend is None
    assert backend.supports_sync_bn
    assert backend.ddp_class() is DistributedDataParallel
    assert backend.ddp_device_kwargs(1) == {"device_ids": [1], "output_device": 1}


def test_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert CudaBackend().device() == torch.device("cuda", 3)
    assert CudaBackend().device(1) == torch.device("cuda", 1)


def test_cuda_autocast_and_grad_scaler(monkeypatch):
    autocast, scaler = mock.Mock(), mock.Mock()
    monkeypatch.setattr(torch.cuda.amp, "autocast", autocast)
    monkeypatch.setattr(torch.cuda.amp, "GradScaler", scaler)
    backend = CudaBackend()
    assert backend.autocast(torch.bfloat16, enabled=False) is autocast.return_value
    autocast.assert_called_once_with(enabled=False, dtype=torch.bfloat16)
    assert backend.grad_scaler(init_scale=2.0) is scaler.return_value
    scaler.assert_called_once_with(init_scale=2.0)


def test_cpu_has_one_card():
    backend = CpuBackend()
    assert backend.is_available() is True
    assert backend.device_count() == 1
    assert backend.current_device() == 0
    assert backend.set_device(0) is None
    assert backend.device() == torch.device("cpu")
    assert backend.device(3) == torch.device("cpu")


def test_cpu_reports_no_memory_and_needs_no_collective_device():
    backend = CpuBackend()
    assert backend.memory_allocated() is None
    assert backend.max_memory_allocated(0) is None
    assert backend.reset_peak_memory_stats() is None
    assert backend.empty_cache() is None
    assert backend.synchronize() is None
    assert backend.manual_seed_all(1) is None
    assert backend.check_dist_backend() is None
    assert backend.device_name() == "cpu"
    assert backend.default_group_backend == "gloo" and backend.device_group_backend is None
    assert not backend.supports_sync_bn and backend.sync_bn_reason


def test_cpu_ddp_and_distributed():
    backend = CpuBackend()
    assert backend.ddp_class() is DistributedDataParallel
    assert backend.ddp_device_kwargs(0) == {}
    assert backend.import_distributed() is dist


@pytest.mark.parametrize("call", ["autocast", "grad_scaler"])
def test_cpu_has_no_mixed_precision(call):
    with pytest.raises(GCUError, match="not available on cpu"):
        getattr(CpuBackend(), call)()


def test_default_optimizer_step_calls_step_with_kwargs():
    optimizer = mock.Mock()
    CpuBackend().optimizer_step(optimizer, tensors=[1], model=object(), closure="c")
    optimizer.step.assert_called_once_with(closure="c")


def test_cpu_facts():
    assert CpuBackend().facts() == {
        "generation": "cpu",
        "device_type": "cpu",
        "description": "no torch_gcu and no CUDA; running on the CPU",
        "available": True,
        "cards": 1,
        "dist_backend": "gloo",
    }


@pytest.mark.parametrize(
    "method, args",
    [("is_available", ()), ("device_count", ()), ("current_device", ()), ("set_device", (0,))],
)
def test_base_backend_leaves_card_queries_to_subclasses(method, args):
    with pytest.raises(NotImplementedError):
        getattr(DeviceBackend(), method)(*args)
