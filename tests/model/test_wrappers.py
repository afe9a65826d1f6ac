"""GCUDistributedDataParallel: device arguments, placement check and vendor re-basing.

The DDP constructors are recorders (torch DDP's ``__init__`` patched, the 1.x vendor class
faked), so no process group is needed. The backends answer ``device()`` with the CPU, so
real modules count as placed on the card.
"""

import re

import pytest
import torch
from mmengine.model import is_model_wrapper

from mmgcu import dist as mdist
from mmgcu.device import GCUError
from mmgcu.model import GCUDistributedDataParallel, wrappers
from tests.model.fakes import ConvBN, VendorDDP, install_legacy, install_v2, record_torch_ddp


@pytest.fixture
def torch_ddp(monkeypatch):
    return record_torch_ddp(monkeypatch)


@pytest.fixture
def v2(monkeypatch, torch_ddp):
    """torch_gcu 2.x, this rank on card 3."""
    return install_v2(monkeypatch, current=3, on_cpu=True)


@pytest.fixture
def legacy(monkeypatch):
    """torch_gcu 1.x, this rank on card 2, with the vendor DDP class."""
    return install_legacy(monkeypatch, current=2, on_cpu=True)


@pytest.fixture
def eccl_group(monkeypatch):
    group = object()
    monkeypatch.setattr(mdist, "_device_group", group)
    return group


# -- device_ids on torch_gcu 2.x --------------------------------------------------


def test_v2_wraps_with_its_card(v2, torch_ddp):
    wrapper = GCUDistributedDataParallel(ConvBN(), broadcast_buffers=False)

    assert torch_ddp == [dict(broadcast_buffers=False, device_ids=[3], output_device=3)]
    assert type(wrapper) is GCUDistributedDataParallel  # torch DDP is the base already
    v2.device.assert_called_with(3)


def test_v2_accepts_the_device_ids_of_its_card(v2, torch_ddp):
    GCUDistributedDataParallel(ConvBN(), device_ids=[3], output_device=3)

    assert torch_ddp == [dict(device_ids=[3], output_device=3)]


def test_none_device_ids_are_dropped(v2, torch_ddp):
    GCUDistributedDataParallel(ConvBN(), device_ids=None, output_device=None)

    assert torch_ddp == [dict(device_ids=[3], output_device=3)]


@pytest.mark.parametrize(
    "key, given, needed",
    [("device_ids", [0], r"\[3\]"), ("output_device", 0, "3")],
)
def test_v2_refuses_another_cards_device_ids(v2, torch_ddp, key, given, needed):
    with pytest.raises(GCUError) as info:
        GCUDistributedDataParallel(ConvBN(), **{key: given})

    message = str(info.value)
    assert f"model_wrapper_cfg.{key}={given} but this rank trains on card 3" in message
    assert re.search(f"needs {key}={needed}", message)
    assert f"Remove {key} from model_wrapper_cfg" in message
    assert torch_ddp == []


def test_v2_uses_the_default_group(v2, torch_ddp):
    GCUDistributedDataParallel(ConvBN())

    assert "process_group" not in torch_ddp[0]


def test_detect_anomalous_params_stays_with_mmengine(v2, torch_ddp):
    wrapper = GCUDistributedDataParallel(ConvBN(), detect_anomalous_params=True)

    assert wrapper.detect_anomalous_params is True
    assert "detect_anomalous_params" not in torch_ddp[0]


# -- torch_gcu 1.x: no device_ids, the ECCL group, the vendor class -----------------


def test_legacy_gets_no_device_ids_and_the_eccl_group(legacy, eccl_group):
    wrapper = GCUDistributedDataParallel(ConvBN(), device_ids=None, broadcast_buffers=False)

    assert wrapper.ddp_kwargs == dict(broadcast_buffers=False, process_group=eccl_group)


def test_legacy_without_a_device_group_uses_the_default_one(legacy):
    wrapper = GCUDistributedDataParallel(ConvBN())

    assert wrapper.ddp_kwargs == {}


def test_legacy_keeps_a_process_group_the_config_gives(legacy, eccl_group):
    mine = object()

    wrapper = GCUDistributedDataParallel(ConvBN(), process_group=mine)

    assert wrapper.ddp_kwargs["process_group"] is mine


def test_legacy_refuses_device_ids(legacy):
    with pytest.raises(GCUError, match=r"device_ids=\[2\] but this rank trains on card 2"):
        GCUDistributedDataParallel(ConvBN(), device_ids=[2])


def test_legacy_wrapper_is_rebased_on_the_vendor_class(legacy):
    module = ConvBN()

    wrapper = GCUDistributedDataParallel(module)

    mro = type(wrapper).__mro__
    assert GCUDistributedDataParallel in mro and VendorDDP in mro
    assert mro.index(GCUDistributedDataParallel) < mro.index(VendorDDP)
    assert type(wrapper).__name__ == "GCUDistributedDataParallel"
    assert wrapper.module is module
    assert is_model_wrapper(wrapper)


def test_rebased_class_is_made_once(legacy):
    first = GCUDistributedDataParallel(ConvBN())
    second = GCUDistributedDataParallel(ConvBN())

    assert type(first) is type(second)
    assert wrappers._rebased == {(GCUDistributedDataParallel, VendorDDP): type(first)}


def test_subclass_after_base_is_rebased_itself(legacy):
    class UserGCUDDP(GCUDistributedDataParallel):
        pass

    GCUDistributedDataParallel(ConvBN())
    wrapper = UserGCUDDP(ConvBN())

    assert isinstance(wrapper, UserGCUDDP)
    assert hasattr(wrapper, "ddp_kwargs")  # __init__ ran


def test_base_after_subclass_is_not_the_subclass(legacy):
    class UserGCUDDP(GCUDistributedDataParallel):
        pass

    UserGCUDDP(ConvBN())
    wrapper = GCUDistributedDataParallel(ConvBN())

    assert not isinstance(wrapper, UserGCUDDP)


# -- a module that is not on the card -----------------------------------------------


def test_module_off_the_card_is_refused_with_names(v2, torch_ddp):
    module = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(4)]).to("meta")

    with pytest.raises(GCUError) as info:
        GCUDistributedDataParallel(module)

    message = str(info.value)
    assert "8 parameter(s)/buffer(s) are not on this rank's card cpu" in message
    shown = "0.weight on meta, 0.bias on meta, 1.weight on meta, 1.bias on meta, 2.weight on meta"
    assert f"{shown} ..." in message
    assert "2.bias" not in message
    assert "model.to('cpu')" in message
    assert torch_ddp == []


def test_misplaced_buffer_is_named_without_ellipsis(v2, torch_ddp):
    module = ConvBN()
    module.bn.running_mean = module.bn.running_mean.to("meta")

    with pytest.raises(GCUError) as info:
        GCUDistributedDataParallel(module)

    message = str(info.value)
    assert "1 parameter(s)/buffer(s)" in message
    assert "bn.running_mean on meta." in message
    assert " ..." not in message


def test_misplaced_lists_parameters_and_buffers():
    module = ConvBN().to("meta")

    wrong = wrappers.misplaced(module, torch.device("cpu"))

    names = [name for name, _ in wrong]
    assert names[:4] == ["conv.weight", "conv.bias", "bn.weight", "bn.bias"]
    assert {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"} <= set(names)
    assert wrappers.misplaced(module, torch.device("meta")) == []
