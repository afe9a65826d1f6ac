"""GCURunner.wrap_model: placement on the rank's card, SyncBN policy and the wrapper type.

Runners are built with ``object.__new__`` and the attributes setup_env would set; the DDP
constructors are recorders, so no process group is needed.
"""

import logging
from unittest import mock

import pytest
import torch
from mmengine.config import Config
from mmengine.model import MMDistributedDataParallel
from mmengine.registry import MODEL_WRAPPERS

import mmgcu.runner as mrunner
from mmgcu import dist as mdist
from mmgcu.device import GCUError
from mmgcu.model import GCUDistributedDataParallel
from mmgcu.runner import GCURunner
from tests.model.fakes import (
    ConvBN,
    VendorDDP,
    install_cpu,
    install_legacy,
    install_v2,
    norm_types,
    record_torch_ddp,
)

CARD = 3


@pytest.fixture
def torch_ddp(monkeypatch):
    return record_torch_ddp(monkeypatch)


@pytest.fixture
def logged(monkeypatch):
    """mmgcu.runner's print_log as a recorder."""
    recorder = mock.Mock()
    monkeypatch.setattr(mrunner, "print_log", recorder)
    return recorder


@pytest.fixture
def v2(monkeypatch, torch_ddp):
    return install_v2(monkeypatch, current=CARD, on_cpu=True)


@pytest.fixture
def legacy(monkeypatch):
    return install_legacy(monkeypatch, current=CARD, on_cpu=True)


@pytest.fixture
def cpu(monkeypatch, torch_ddp):
    return install_cpu(monkeypatch)


@pytest.fixture
def user_ddp():
    """A user's MMDistributedDataParallel subclass, registered under a test-only name."""

    class UserDDP(MMDistributedDataParallel):
        pass

    name = "_MmgcuTestUserDDP"
    MODEL_WRAPPERS.register_module(name=name, module=UserDDP, force=True)
    yield name, UserDDP
    MODEL_WRAPPERS._module_dict.pop(name, None)


def make_runner(backend, distributed=True, card=CARD, **cfg):
    runner = object.__new__(GCURunner)
    runner._launcher = "pytorch" if distributed else "none"
    runner._distributed = distributed
    runner.cfg = Config(cfg)
    runner.device_backend = backend
    runner.card = card
    return runner


def spy_to(monkeypatch, model):
    spy = mock.Mock(wraps=model.to)
    monkeypatch.setattr(model, "to", spy)
    return spy


def warnings_of(logged):
    return [c for c in logged.call_args_list if c.kwargs.get("level") == logging.WARNING]


# -- one process --------------------------------------------------------------------


def test_single_process_on_cpu_reverts_sync_bn(cpu, logged):
    model = ConvBN(sync=True)

    placed = make_runner(cpu, distributed=False, card=0).wrap_model(None, model)

    assert not isinstance(placed, MMDistributedDataParallel)
    assert torch.nn.SyncBatchNorm not in norm_types(placed)
    assert all(p.device.type == "cpu" for p in placed.parameters())


def test_single_process_moves_the_model_to_the_rank_card(v2, monkeypatch):
    model = ConvBN()
    to = spy_to(monkeypatch, model)

    placed = make_runner(v2, distributed=False, card=5).wrap_model(None, model)

    assert v2.device.call_args_list  # every card asked for is this rank's
    assert all(c == mock.call(5) for c in v2.device.call_args_list)
    to.assert_called_once_with(v2.device.return_value)
    assert placed is model


def test_distributed_moves_the_model_before_wrapping(v2, monkeypatch, torch_ddp):
    model = ConvBN()
    to = spy_to(monkeypatch, model)

    wrapper = make_runner(v2).wrap_model(None, model)

    assert v2.device.call_args_list[0] == mock.call(CARD)
    to.assert_called_once_with(v2.device.return_value)
    assert wrapper.module is model


def test_wrapped_model_is_returned_unchanged(v2, torch_ddp):
    wrapper = GCUDistributedDataParallel(ConvBN())
    v2.device.reset_mock()

    assert make_runner(v2).wrap_model(None, wrapper) is wrapper
    v2.device.assert_not_called()


# -- the wrapper type ---------------------------------------------------------------


def test_missing_cfg_gets_mmengine_defaults(v2, torch_ddp):
    wrapper = make_runner(v2).wrap_model(None, ConvBN())

    assert type(wrapper) is GCUDistributedDataParallel
    assert torch_ddp == [
        dict(
            broadcast_buffers=False,
            find_unused_parameters=False,
            device_ids=[CARD],
            output_device=CARD,
        )
    ]


def test_missing_cfg_takes_find_unused_parameters_from_the_config(v2, torch_ddp):
    make_runner(v2, find_unused_parameters=True).wrap_model(None, ConvBN())

    assert torch_ddp[0]["find_unused_parameters"] is True


@pytest.mark.parametrize(
    "stock",
    [
        "MMDistributedDataParallel",
        "DistributedDataParallel",
        MMDistributedDataParallel,
        torch.nn.parallel.DistributedDataParallel,
    ],
    ids=["mm-name", "torch-name", "mm-class", "torch-class"],
)
def test_stock_wrapper_types_become_gcu_ddp(v2, torch_ddp, stock):
    given = dict(type=stock, broadcast_buffers=True)

    wrapper = make_runner(v2).wrap_model(given, ConvBN())

    assert type(wrapper) is GCUDistributedDataParallel
    assert torch_ddp == [dict(broadcast_buffers=True, device_ids=[CARD], output_device=CARD)]
    assert given == dict(type=stock, broadcast_buffers=True)  # the config is not changed


def test_cfg_without_type_becomes_gcu_ddp(v2, torch_ddp):
    wrapper = make_runner(v2).wrap_model(dict(find_unused_parameters=True), ConvBN())

    assert type(wrapper) is GCUDistributedDataParallel
    assert torch_ddp[0]["find_unused_parameters"] is True
    assert "broadcast_buffers" not in torch_ddp[0]


@pytest.mark.parametrize(
    "key,value", [("device_ids", [CARD]), ("device_ids", [0]), ("output_device", CARD)]
)
def test_config_device_ids_are_refused_on_every_rank(v2, torch_ddp, key, value):
    """One config serves all ranks: even the value right for this rank is wrong for others."""
    cfg = dict(type="MMDistributedDataParallel", **{key: value})

    with pytest.raises(GCUError, match=f"model_wrapper_cfg.{key}=.*Remove {key}"):
        make_runner(v2).wrap_model(cfg, ConvBN())
    assert torch_ddp == []


def test_config_device_ids_none_is_dropped(v2, torch_ddp):
    cfg = dict(type="MMDistributedDataParallel", device_ids=None, output_device=None)

    make_runner(v2).wrap_model(cfg, ConvBN())

    assert torch_ddp[0]["device_ids"] == [CARD] and torch_ddp[0]["output_device"] == CARD


def test_user_ddp_subclass_gets_the_device_kwargs(v2, torch_ddp, user_ddp):
    name, user_class = user_ddp

    wrapper = make_runner(v2).wrap_model(dict(type=name, bucket_cap_mb=10), ConvBN())

    assert type(wrapper) is user_class
    assert torch_ddp == [dict(bucket_cap_mb=10, device_ids=[CARD], output_device=CARD)]


def test_legacy_wraps_on_the_vendor_class_in_the_eccl_group(legacy, monkeypatch):
    group = object()
    monkeypatch.setattr(mdist, "_device_group", group)

    wrapper = make_runner(legacy).wrap_model(None, ConvBN())

    assert isinstance(wrapper, GCUDistributedDataParallel)
    assert isinstance(wrapper, VendorDDP)
    assert wrapper.ddp_kwargs == dict(
        broadcast_buffers=False, find_unused_parameters=False, process_group=group
    )


# -- SyncBatchNorm --------------------------------------------------------------------


def test_sync_bn_is_converted_where_supported(v2, torch_ddp, logged):
    wrapper = make_runner(v2, sync_bn="torch").wrap_model(None, ConvBN())

    assert norm_types(wrapper.module) == [torch.nn.SyncBatchNorm]
    assert warnings_of(logged) == []


def test_model_sync_bn_is_kept_where_supported(v2, torch_ddp, logged):
    wrapper = make_runner(v2).wrap_model(None, ConvBN(sync=True))

    assert norm_types(wrapper.module) == [torch.nn.SyncBatchNorm]
    assert warnings_of(logged) == []


def test_plain_bn_is_left_alone_without_sync_bn(v2, torch_ddp, logged):
    wrapper = make_runner(v2).wrap_model(None, ConvBN())

    assert norm_types(wrapper.module) == [torch.nn.BatchNorm2d]


@pytest.mark.parametrize("generation", ["legacy", "cpu"])
@pytest.mark.parametrize("sync_cfg, sync_model", [("torch", False), (None, True)])
def test_sync_bn_is_reverted_with_a_warning_where_unsupported(
    generation, sync_cfg, sync_model, request, torch_ddp, logged
):
    backend = request.getfixturevalue(generation)
    cfg = {} if sync_cfg is None else dict(sync_bn=sync_cfg)

    wrapper = make_runner(backend, **cfg).wrap_model(None, ConvBN(sync=sync_model))

    assert torch.nn.SyncBatchNorm not in norm_types(wrapper.module)
    assert len(norm_types(wrapper.module)) == 1
    (warning,) = warnings_of(logged)
    message = warning.args[0]
    assert message.startswith(f"SyncBatchNorm is reverted to BatchNorm on {generation}: ")
    assert backend.sync_bn_reason and backend.sync_bn_reason in message


def test_legacy_names_the_missing_kernel(legacy, logged):
    make_runner(legacy, sync_bn="torch").wrap_model(None, ConvBN())

    (warning,) = warnings_of(logged)
    assert "no SyncBatchNorm kernel for XLA devices" in warning.args[0]


def test_no_warning_without_sync_bn_where_unsupported(legacy, logged):
    wrapper = make_runner(legacy).wrap_model(None, ConvBN())

    assert norm_types(wrapper.module) == [torch.nn.BatchNorm2d]
    assert warnings_of(logged) == []


def test_legacy_user_ddp_subclass_gets_the_eccl_group(legacy, torch_ddp, user_ddp, monkeypatch):
    group = object()
    monkeypatch.setattr(mdist, "_device_group", group)
    name, _ = user_ddp

    make_runner(legacy).wrap_model(dict(type=name), ConvBN())

    assert torch_ddp[0].get("process_group") is group
