"""DeviceModuleAccelerator: the delegation to a ``torch.cuda``-like module that CUDA and
torch_gcu 2.x (``torch.gcu``) share, driven here by a mock module."""

from unittest import mock

import pytest

from mmgcu.device import DeviceModuleAccelerator

# (accelerator method, its arguments, the module's function, its answer, the method's)
QUERIES = [
    ("is_available", (), "is_available", 1, True),
    ("device_count", (), "device_count", 2, 2),
    ("current_device", (), "current_device", 1, 1),
    ("device_name", (1,), "get_device_name", "T20", "T20"),
]
ACTIONS = [
    ("set_device", (1,), "set_device"),
    ("manual_seed_all", (7,), "manual_seed_all"),
]


@pytest.fixture
def module():
    return mock.Mock()


@pytest.mark.parametrize("method, args, module_fn, given, expected", QUERIES)
def test_queries_answer_from_the_module(module, method, args, module_fn, given, expected):
    getattr(module, module_fn).return_value = given
    answer = getattr(DeviceModuleAccelerator(module), method)(*args)
    assert answer == expected and type(answer) is type(expected)
    getattr(module, module_fn).assert_called_once_with(*args)


@pytest.mark.parametrize("method, args, module_fn", ACTIONS)
def test_actions_go_to_the_module(module, method, args, module_fn):
    getattr(DeviceModuleAccelerator(module), method)(*args)
    getattr(module, module_fn).assert_called_once_with(*args)


def test_the_peak_is_read_and_reset(module):
    module.max_memory_allocated.return_value = 4096
    accelerator = DeviceModuleAccelerator(module)
    assert accelerator.peak_memory(1) == 4096
    module.reset_peak_memory_stats.assert_called_once_with(1)
    assert "max_memory_allocated" in accelerator.memory_source


def test_the_cache_is_emptied(module):
    accelerator = DeviceModuleAccelerator(module)
    assert accelerator.caches_memory is True
    assert accelerator.empty_cache() is True
    module.empty_cache.assert_called_once_with()
