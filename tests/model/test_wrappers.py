"""The DDP wrappers: ``ddp_config``, GCUDistributedDataParallel and GCU1DistributedDataParallel.

GCUDistributedDataParallel is checked with torch DDP's constructor recorded (torch_gcu 2.x,
card 3) and for real on the CPU in a one-rank gloo world. GCU1DistributedDataParallel is
checked over the fake vendor DDP (:class:`tests.fakes.FakeGCU1DDP`) and once around the
simulated torch_gcu 1.x DDP in a fresh process.
"""

import os

import pytest
import torch
from mmengine.model import MMDistributedDataParallel, is_model_wrapper
from mmengine.optim import OptimWrapper
from mmengine.registry import MODEL_WRAPPERS

from mmgcu.device import GCUError
from mmgcu.model import GCU1DistributedDataParallel, GCUDistributedDataParallel
from mmgcu.model.wrappers import ddp_config
from tests import fakes
from tests.conftest import free_port, last_json, run_program
from tests.fakes import ConvBN, ToyModel, toy_batch

CARD = 3
PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "gcu1_ddp_on_sim.py")


@pytest.fixture
def torch_ddp(monkeypatch):
    return fakes.record_torch_ddp(monkeypatch)


@pytest.fixture
def gcu2(monkeypatch):
    """torch_gcu 2.x, this rank on card 3 (whose device() is the CPU)."""
    return fakes.gcu2(monkeypatch, current=CARD, on_cpu=True)


@pytest.fixture
def gcu1(monkeypatch):
    """torch_gcu 1.x, this rank on card 3, its ECCL world made."""
    return fakes.gcu1_in_world(monkeypatch, current=CARD)


@pytest.fixture
def gloo_world():
    """A one-rank gloo world in this process."""
    torch.distributed.init_process_group(
        "gloo", store=torch.distributed.HashStore(), rank=0, world_size=1
    )
    yield
    torch.distributed.destroy_process_group()


def off_the_card():
    return torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(4)]).to("meta")


# -- ddp_config ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, value", [("device_ids", [CARD]), ("device_ids", [0]), ("output_device", 3)]
)
def test_config_device_arguments_are_refused_for_every_rank(gcu2, key, value):
    """One config serves all ranks: even the value right for this rank is wrong for others."""
    with pytest.raises(GCUError) as err:
        ddp_config({key: value}, gcu2, CARD)
    message = str(err.value)
    assert message.startswith(f"model_wrapper_cfg.{key}={value}, but each rank trains on")
    assert f"Remove {key} from model_wrapper_cfg" in message


def test_config_device_arguments_none_are_dropped(gcu2):
    cfg = dict(type="MMDistributedDataParallel", device_ids=None, output_device=None, dim=0)
    assert ddp_config(cfg, gcu2, CARD) == dict(type="MMDistributedDataParallel", dim=0)
    assert "device_ids" in cfg  # the caller's config is not changed


# -- GCUDistributedDataParallel --------------------------------------------------------------------


def test_gcu2_wraps_on_its_card(gcu2, torch_ddp):
    wrapper = GCUDistributedDataParallel(ConvBN(), gcu2, broadcast_buffers=False)

    assert torch_ddp == [dict(broadcast_buffers=False, device_ids=[CARD], output_device=CARD)]
    assert isinstance(wrapper, MMDistributedDataParallel)
    assert is_model_wrapper(wrapper)
    gcu2.device.assert_called_with(CARD)


def test_the_default_group_carries_the_gradients(gcu2, torch_ddp):
    GCUDistributedDataParallel(ConvBN(), gcu2)
    assert "process_group" not in torch_ddp[0]


def test_detect_anomalous_params_stays_with_mmengine(gcu2, torch_ddp):
    wrapper = GCUDistributedDataParallel(ConvBN(), gcu2, detect_anomalous_params=True)

    assert wrapper.detect_anomalous_params is True
    assert "detect_anomalous_params" not in torch_ddp[0]


@pytest.mark.parametrize("wrapper", [GCUDistributedDataParallel, GCU1DistributedDataParallel])
def test_a_module_off_the_card_is_refused_with_names(request, torch_ddp, wrapper):
    accelerator = request.getfixturevalue(
        "gcu2" if wrapper is GCUDistributedDataParallel else "gcu1"
    )
    with pytest.raises(GCUError) as err:
        wrapper(off_the_card(), accelerator)

    message = str(err.value)
    assert message.startswith("rank 0: 8 parameter(s)/buffer(s) are not on its card cpu: ")
    assert "0.weight on meta, 0.bias on meta" in message and "2.bias" not in message
    assert torch_ddp == []


def test_trains_on_the_cpu_in_a_gloo_world(gloo_world):
    model = ToyModel()
    wrapper = GCUDistributedDataParallel(model, fakes.cpu(), broadcast_buffers=False)
    optim_wrapper = OptimWrapper(torch.optim.SGD(wrapper.parameters(), lr=0.1))
    before = model.linear.weight.detach().clone()

    log_vars = wrapper.train_step(toy_batch(), optim_wrapper)

    assert set(log_vars) == {"loss"}
    assert not torch.equal(before, model.linear.weight)
    assert wrapper.device_ids is None  # the CPU takes no device arguments
    assert len(wrapper.val_step(toy_batch())) == 1


def test_the_wrappers_are_registered():
    assert MODEL_WRAPPERS.get("GCUDistributedDataParallel") is GCUDistributedDataParallel
    assert MODEL_WRAPPERS.get("GCU1DistributedDataParallel") is GCU1DistributedDataParallel


# -- GCU1DistributedDataParallel -------------------------------------------------------------------


def test_gcu1_holds_the_vendor_ddp_on_its_card_and_eccl_group(gcu1):
    model = ToyModel()

    wrapper = GCU1DistributedDataParallel(model, gcu1, broadcast_buffers=False, bucket_cap_mb=10)

    assert isinstance(wrapper.ddp, fakes.FakeGCU1DDP)
    assert wrapper.ddp.kwargs == dict(
        broadcast_buffers=False,
        bucket_cap_mb=10,
        device_ids=[CARD],  # device_ids=None would replicate the model onto every card
        process_group=gcu1.card_group.group,
    )
    assert wrapper.module is model and wrapper.ddp.module is model
    assert is_model_wrapper(wrapper)
    assert not isinstance(wrapper, torch.nn.parallel.DistributedDataParallel)
    assert wrapper.detect_anomalous_params is False


def test_gcu1_forward_goes_through_the_vendor_ddp(gcu1):
    wrapper = GCU1DistributedDataParallel(ToyModel(), gcu1)
    calls = []
    wrapper.ddp.register_forward_hook(lambda module, args, output: calls.append(output))

    out = wrapper(**toy_batch(), mode="loss")

    assert calls == [out] and set(out) == {"loss"}


def test_gcu1_steps_are_mmengines(gcu1):
    model = ToyModel()
    wrapper = GCU1DistributedDataParallel(model, gcu1, detect_anomalous_params=True)
    optim_wrapper = OptimWrapper(torch.optim.SGD(wrapper.parameters(), lr=0.1))
    before = model.linear.weight.detach().clone()

    log_vars = wrapper.train_step(toy_batch(), optim_wrapper)

    assert set(log_vars) == {"loss"}
    assert not torch.equal(before, model.linear.weight)
    assert wrapper.train_step.__func__ is MMDistributedDataParallel.train_step
    assert [t.shape for t in wrapper.val_step(toy_batch())] == [torch.Size([4, 1])]
    assert [t.shape for t in wrapper.test_step(toy_batch())] == [torch.Size([4, 1])]


def test_gcu1_accumulation_skips_the_vendor_gradient_sync(gcu1):
    wrapper = GCU1DistributedDataParallel(ToyModel(), gcu1)
    synced = []
    wrapper.module.register_forward_hook(lambda *_: synced.append(wrapper.ddp.grad_sync))
    optim_wrapper = OptimWrapper(
        torch.optim.SGD(wrapper.parameters(), lr=0.1), accumulative_counts=2
    )

    for _ in range(4):
        wrapper.train_step(toy_batch(), optim_wrapper)

    assert synced == [False, True, False, True]


def test_gcu1_no_sync_is_the_vendors(gcu1):
    wrapper = GCU1DistributedDataParallel(ToyModel(), gcu1)
    with wrapper.no_sync():
        assert wrapper.ddp.grad_sync is False
    assert wrapper.ddp.grad_sync is True


def test_gcu1_around_the_simulated_vendor_ddp():
    out = last_json(
        run_program(
            PROGRAM,
            MMGCU_SIMULATE=2,
            MMGCU_SIMULATE_API="gcu1",
            RANK=0,
            WORLD_SIZE=1,
            LOCAL_RANK=1,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=free_port(),
        ).stdout
    )
    assert out["on_cpu"].startswith("rank 0: 2 parameter(s)/buffer(s) are not on its card xla:1")
    assert out["wrapper"] == {
        "is_model_wrapper": True,
        "module_is_model": True,
        "vendor": "mmgcu.sim.torch_gcu1.nn.parallel.distributed.DistributedDataParallel",
        "device_ids": [1],
        "eccl_group": True,
        "broadcast_buffers": False,
    }
    train = out["train"]
    assert train["graph_runs"] == 2  # one lazy step per two accumulated iterations
    assert train["synced"] == [False, True, False, True]  # no gradient sync mid-accumulation
    assert train["moved"] is True
    assert train["losses"][0] == train["losses"][1] > train["losses"][2]
    assert out["val"] == out["test"] == ["xla:1"]
    assert out["forward"] == "xla:1"
