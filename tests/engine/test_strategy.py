"""GCUStrategy: this rank's card and the process groups, then the model on its card in the
accelerator's DDP, on faked vendor modules (no process group is created).

The vendor modules come from :mod:`tests.fakes`, so the strategy works on a real
accelerator over them; card choices and group creation are recorded in ``events``.
"""

import datetime
import logging
import os
import sys
from unittest import mock

import pytest
import torch
from mmengine.model import BaseDataPreprocessor, MMDistributedDataParallel
from mmengine.registry import MODEL_WRAPPERS

import mmgcu.engine.strategy as mstrategy
from mmgcu import GCU1DistributedDataParallel, GCUDistributedDataParallel
from mmgcu.counterparts import Counterparts
from mmgcu.device import GCUError, select_accelerator
from mmgcu.device.fallback import CPUAccelerator
from mmgcu.engine.strategy import GCUStrategy
from mmgcu.model import GCUSyncBatchNorm
from tests import fakes
from tests.conftest import free_port
from tests.fakes import ConvBN, norm_types

CARD = 3

#: The groups each kind creates: torch.distributed's backend (and torch_gcu 1.x's ECCL world).
GROUPS = {
    "gcu2": [("init_process_group", "cpu:gloo,gcu:eccl")],
    "gcu1": [("init_process_group", "gloo_eccl"), ("eccl init_process_group", "eccl")],
    "cuda": [("init_process_group", "nccl")],
    "cpu": [("init_process_group", "gloo")],
}


@pytest.fixture(autouse=True)
def launcher_env(no_launcher_env):
    """No launcher variables but a one-rank torchrun's; the slurm/mpi set-up writes
    os.environ, which no_launcher_env restores."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", RANK="0", WORLD_SIZE="1")


@pytest.fixture
def events():
    return []


@pytest.fixture
def torch_dist(monkeypatch, events):
    """torch.distributed's group creation recorded; is_initialized follows it."""
    state = dict(initialized=False, kwargs=None)

    def init_process_group(backend=None, **kwargs):
        assert not state["initialized"], "init_process_group called twice"
        events.append(("init_process_group", backend))
        state.update(initialized=True, kwargs=kwargs)

    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: state["initialized"])
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "fake")
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 8)
    # torchrun's agent store: torch_gcu 1.x's ECCL world meets there (no port to exchange).
    port = free_port()
    state["store"] = torch.distributed.TCPStore(
        "127.0.0.1", port, 1, True, datetime.timedelta(seconds=10)
    )
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_PORT", str(port))
    return state


@pytest.fixture
def logged(monkeypatch):
    """mmgcu.engine.strategy's print_log as a recorder."""
    recorder = mock.Mock()
    monkeypatch.setattr(mstrategy, "print_log", recorder)
    return recorder


def install(kind, monkeypatch, events, **kwargs):
    """The vendor modules of ``kind`` (a real accelerator over them is returned too)."""
    if kind == "cpu":
        monkeypatch.setitem(sys.modules, "torch_gcu", None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.delattr(torch, "gcu", raising=False)
        return fakes.cpu()
    if kind == "cuda":
        monkeypatch.setitem(sys.modules, "torch_gcu", None)
        monkeypatch.delattr(torch, "gcu", raising=False)
    return fakes.ACCELERATORS[kind](monkeypatch, events=events, **kwargs)


def strategy_for(launcher, env_cfg):
    """The strategy GCURunner creates for ``env_cfg`` (the accelerator it names)."""
    accelerator = select_accelerator(env_cfg.get("device", "auto"), env_cfg.get("gcu_jit_mode"))
    return GCUStrategy(accelerator, Counterparts(accelerator), launcher)


def set_up(launcher, env_cfg):
    """A strategy after its set-up (what GCURunner.setup_env does before mmengine's)."""
    strategy = strategy_for(launcher, env_cfg)
    strategy.setup(env_cfg)
    return strategy


def placed(accelerator, distributed=True, card=CARD):
    """A strategy after its set-up: its accelerator on its card."""
    accelerator.set_device(card)
    return GCUStrategy(accelerator, Counterparts(accelerator), "pytorch" if distributed else "none")


def wrapped(accelerator, model_wrapper_cfg, model, distributed=True, card=CARD, **cfg):
    """``model`` as the strategy wraps it, with the config's ``sync_bn`` and
    ``find_unused_parameters`` in ``cfg``."""
    return placed(accelerator, distributed, card).wrap(model, model_wrapper_cfg, **cfg)


# -- set-up ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("requested", [None, "nccl"])
@pytest.mark.parametrize("kind", ["gcu2", "gcu1", "cuda", "cpu"])
def test_the_card_is_set_before_the_groups_are_made(
    kind, requested, monkeypatch, events, torch_dist
):
    install(kind, monkeypatch, events)
    card = 0 if kind == "cpu" else CARD
    os.environ["LOCAL_RANK"] = str(card)
    dist_cfg = {} if requested is None else dict(backend=requested)
    strategy = set_up("pytorch", dict(device=kind, dist_cfg=dist_cfg))

    chosen = [] if kind == "cpu" else [("set_device", card)]
    assert events == chosen + GROUPS[kind]
    assert strategy.card == card
    assert strategy.accelerator.kind == kind
    assert strategy.accelerator.card_group is not None


@pytest.mark.parametrize("kind", ["gcu2", "gcu1"])
def test_auto_finds_the_gcu_and_never_sets_a_cuda_device(kind, monkeypatch, events, torch_dist):
    cuda_set_device = mock.Mock()
    monkeypatch.setattr(torch.cuda, "set_device", cuda_set_device)
    install(kind, monkeypatch, events)
    os.environ["LOCAL_RANK"] = "2"
    strategy = set_up("pytorch", dict(dist_cfg=dict(backend="nccl")))

    assert strategy.accelerator.kind == kind
    assert events[0] == ("set_device", 2)
    cuda_set_device.assert_not_called()


def test_the_device_the_config_names_is_used(monkeypatch, events, torch_dist):
    install("gcu2", monkeypatch, events)

    strategy = set_up("none", dict(device="cpu"))

    assert isinstance(strategy.accelerator, CPUAccelerator)
    assert events == []  # the GCU was not touched


def test_gcu_jit_mode_reaches_the_accelerator(monkeypatch, events, torch_dist):
    install("gcu1", monkeypatch, events)
    strategy = set_up("none", dict(gcu_jit_mode="SYNC"))
    assert strategy.accelerator.summary()["jit_mode"] == "SYNC"


def test_gloo_is_refused_on_gcu2(monkeypatch, events, torch_dist):
    install("gcu2", monkeypatch, events)
    os.environ["LOCAL_RANK"] = "0"

    with pytest.raises(GCUError, match="'gloo' cannot carry GCU tensors"):
        set_up("pytorch", dict(dist_cfg=dict(backend="gloo")))

    assert not torch_dist["initialized"]


@pytest.mark.parametrize("kind", ["gcu1", "cpu"])
def test_gloo_is_kept_where_it_is_the_default_group(kind, monkeypatch, events, torch_dist):
    install(kind, monkeypatch, events)
    os.environ["LOCAL_RANK"] = "0"

    set_up("pytorch", dict(device=kind, dist_cfg=dict(backend="gloo")))

    assert ("init_process_group", "gloo") in events


def test_gcu2_without_eccl_stops_before_the_group(monkeypatch, events, torch_dist):
    install("gcu2", monkeypatch, events, eccl=False)
    os.environ["LOCAL_RANK"] = "0"

    with pytest.raises(GCUError, match="ECCL is not available"):
        set_up("pytorch", {})

    assert not torch_dist["initialized"]


def test_dist_cfg_timeout_reaches_both_groups(monkeypatch, events, torch_dist):
    accelerator = install("gcu1", monkeypatch, events)
    os.environ["LOCAL_RANK"] = "0"

    set_up("pytorch", dict(dist_cfg=dict(backend="nccl", timeout=1800)))

    timeout = datetime.timedelta(seconds=1800)
    assert torch_dist["kwargs"]["timeout"] == timeout
    eccl = accelerator.torch_gcu.distributed.init_process_group.call_args.kwargs
    assert eccl["timeout"] == timeout


def test_a_missing_local_rank_is_named(monkeypatch, events, torch_dist):
    install("gcu2", monkeypatch, events)

    with pytest.raises(GCUError, match="LOCAL_RANK is not set"):
        set_up("pytorch", {})

    assert events == []


def test_a_local_rank_without_a_card_stops_before_the_group(monkeypatch, events, torch_dist):
    install("gcu2", monkeypatch, events, cards=4)
    os.environ["LOCAL_RANK"] = "4"

    with pytest.raises(GCUError, match=r"local rank 4 has no card.*0\.\.3"):
        set_up("pytorch", {})

    assert events == []


def test_a_group_the_caller_made_is_adopted(monkeypatch, events, torch_dist):
    install("gcu2", monkeypatch, events, current=5)
    torch_dist["initialized"] = True

    strategy = set_up("pytorch", dict(dist_cfg=dict(backend="nccl")))

    assert strategy.card == 5
    assert events == []
    assert strategy.accelerator.card_group.dist is torch.distributed


def test_gcu1_needs_the_eccl_world_when_the_caller_made_the_group(monkeypatch, events, torch_dist):
    install("gcu1", monkeypatch, events)
    torch_dist["initialized"] = True

    with pytest.raises(GCUError, match="torch_gcu.distributed was not"):
        set_up("pytorch", {})


@pytest.mark.parametrize("kind", ["gcu2", "gcu1", "cuda", "cpu"])
def test_a_single_process_uses_card_zero_without_a_group(kind, monkeypatch, events, torch_dist):
    install(kind, monkeypatch, events, **({} if kind == "cpu" else dict(current=6)))
    strategy = set_up("none", dict(device=kind, dist_cfg=dict(backend="nccl")))

    chosen = [] if kind == "cpu" else [("set_device", 0)]
    assert events == chosen
    assert strategy.card == 0 and strategy.accelerator.card_group is None


def test_slurm_environment_becomes_torch_environment(monkeypatch, events, torch_dist):
    install("gcu2", monkeypatch, events)
    for name in ("RANK", "WORLD_SIZE"):
        os.environ.pop(name)
    os.environ.update(SLURM_PROCID="5", SLURM_NTASKS="16", SLURM_LOCALID="1", MASTER_ADDR="node0")
    strategy = set_up("slurm", dict(dist_cfg=dict(backend="nccl", port=29999)))

    assert events == [("set_device", 1)] + GROUPS["gcu2"]
    assert strategy.card == 1
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("5", "16")
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("node0", "29999")
    assert "port" not in torch_dist["kwargs"]


def test_slurm_without_srun_variables_is_refused(monkeypatch, events, torch_dist):
    install("gcu2", monkeypatch, events)

    with pytest.raises(GCUError, match="SLURM_PROCID, SLURM_NTASKS is not set"):
        set_up("slurm", {})

    assert events == []


def test_mpi_environment_becomes_torch_environment(monkeypatch, events, torch_dist):
    install("gcu1", monkeypatch, events)
    os.environ.update(
        OMPI_COMM_WORLD_RANK="6", OMPI_COMM_WORLD_SIZE="8", OMPI_COMM_WORLD_LOCAL_RANK="2"
    )
    set_up("mpi", dict(dist_cfg=dict(backend="nccl")))

    assert events == [("set_device", 2)] + GROUPS["gcu1"]
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == (
        "6",
        "8",
        "2",
    )


def test_an_unknown_launcher_is_refused(monkeypatch, events, torch_dist):
    install("gcu2", monkeypatch, events)

    with pytest.raises(GCUError, match="unknown launcher 'lsf'"):
        set_up("lsf", {})

    assert not torch_dist["initialized"]


@pytest.mark.parametrize("kind", ["gcu2", "gcu1", "cpu"])
def test_cudnn_benchmark_is_dropped_off_cuda(kind, monkeypatch, events, torch_dist):
    install(kind, monkeypatch, events)
    env_cfg = dict(device=kind, cudnn_benchmark=True, mp_cfg=dict(opencv_num_threads=0))

    for_mmengine = strategy_for("none", env_cfg).setup(env_cfg)

    assert for_mmengine == dict(device=kind, mp_cfg=dict(opencv_num_threads=0))
    assert env_cfg["cudnn_benchmark"] is True  # the caller's dict is not changed


def test_cudnn_benchmark_is_kept_on_cuda(monkeypatch, events, torch_dist):
    install("cuda", monkeypatch, events)
    env_cfg = dict(cudnn_benchmark=True)

    assert strategy_for("none", env_cfg).setup(env_cfg) == dict(cudnn_benchmark=True)


# -- the model ------------------------------------------------------------------------------------


@pytest.fixture
def torch_ddp(monkeypatch):
    return fakes.record_torch_ddp(monkeypatch)


@pytest.fixture
def gcu2(monkeypatch):
    return fakes.gcu2(monkeypatch, current=CARD, on_cpu=True)


@pytest.fixture
def gcu1(monkeypatch):
    return fakes.gcu1_in_world(monkeypatch, current=CARD)


@pytest.fixture
def cuda(monkeypatch):
    return fakes.cuda(monkeypatch, current=CARD, on_cpu=True)


@pytest.fixture
def user_ddp():
    """A user's MMDistributedDataParallel subclass, registered under a test-only name."""

    class UserDDP(MMDistributedDataParallel):
        pass

    name = "_MmgcuTestUserDDP"
    MODEL_WRAPPERS.register_module(name=name, module=UserDDP, force=True)
    yield name, UserDDP
    MODEL_WRAPPERS._module_dict.pop(name, None)


def reverted(model):
    """Whether the one norm layer of ``model`` is a plain BatchNorm (mmengine's revert)."""
    (norm,) = norm_types(model)
    return (
        issubclass(norm, torch.nn.modules.batchnorm._BatchNorm)
        and norm is not torch.nn.SyncBatchNorm
    )


def warnings_of(logged):
    return [c.args[0] for c in logged.call_args_list if c.kwargs.get("level") == logging.WARNING]


def test_a_single_process_on_the_cpu_reverts_sync_bn():
    placed = wrapped(fakes.cpu(), None, ConvBN(sync=True), distributed=False, card=0)

    assert not isinstance(placed, MMDistributedDataParallel)
    assert reverted(placed)


def test_a_single_process_moves_the_model_to_its_card(gcu2, monkeypatch):
    model = ConvBN()
    to = mock.Mock(wraps=model.to)
    monkeypatch.setattr(model, "to", to)

    placed = wrapped(gcu2, None, model, distributed=False, card=0)

    assert placed is model
    gcu2.device.assert_called_with(0)
    to.assert_called_once_with(gcu2.device.return_value)


def test_the_first_batch_is_watched(monkeypatch):
    class Forgetful(BaseDataPreprocessor):
        def forward(self, data, training=False):
            return data  # a custom preprocessor that does not move the batch

    accelerator = fakes.cpu()
    monkeypatch.setattr(accelerator, "device", lambda index=None: torch.device("meta"))
    model = fakes.ToyModel()
    model.data_preprocessor = Forgetful()

    wrapped(accelerator, None, model, distributed=False, card=0)

    assert model.linear.weight.device.type == "meta"
    with pytest.raises(GCUError, match="returned a batch on cpu, but the model is on meta"):
        model.data_preprocessor({"inputs": torch.ones(1)})


def test_distributed_moves_the_model_before_wrapping(gcu2, monkeypatch, torch_ddp):
    model = ConvBN()
    to = mock.Mock(wraps=model.to)
    monkeypatch.setattr(model, "to", to)

    wrapper = wrapped(gcu2, None, model)

    assert gcu2.device.call_args_list[0] == mock.call(CARD)
    to.assert_called_once_with(gcu2.device.return_value)
    assert wrapper.module is model


def test_a_missing_cfg_gets_mmengines_defaults(gcu2, torch_ddp):
    wrapper = wrapped(gcu2, None, ConvBN())

    assert type(wrapper) is GCUDistributedDataParallel
    assert torch_ddp == [
        dict(
            broadcast_buffers=False,
            find_unused_parameters=False,
            device_ids=[CARD],
            output_device=CARD,
        )
    ]


def test_a_missing_cfg_takes_find_unused_parameters_from_the_config(gcu2, torch_ddp):
    wrapped(gcu2, None, ConvBN(), find_unused_parameters=True)

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
def test_stock_wrapper_types_become_the_accelerators_wrapper(gcu2, gcu1, torch_ddp, stock):
    given = dict(type=stock, broadcast_buffers=True)

    on_gcu2 = wrapped(gcu2, given, ConvBN())
    on_gcu1 = wrapped(gcu1, given, ConvBN())

    assert type(on_gcu2) is GCUDistributedDataParallel
    assert torch_ddp == [dict(broadcast_buffers=True, device_ids=[CARD], output_device=CARD)]
    assert type(on_gcu1) is GCU1DistributedDataParallel
    assert on_gcu1.ddp.kwargs == dict(
        broadcast_buffers=True, device_ids=[CARD], process_group=gcu1.card_group.group
    )
    assert given == dict(type=stock, broadcast_buffers=True)  # the config is not changed


def test_a_cfg_without_type_becomes_the_accelerators_wrapper(gcu2, torch_ddp):
    wrapper = wrapped(gcu2, dict(find_unused_parameters=True), ConvBN())

    assert type(wrapper) is GCUDistributedDataParallel
    assert torch_ddp[0]["find_unused_parameters"] is True
    assert "broadcast_buffers" not in torch_ddp[0]


@pytest.mark.parametrize(
    "key,value", [("device_ids", [CARD]), ("device_ids", [0]), ("output_device", CARD)]
)
def test_config_device_ids_are_refused(gcu2, torch_ddp, key, value):
    cfg = dict(type="MMDistributedDataParallel", **{key: value})

    with pytest.raises(GCUError, match=f"model_wrapper_cfg.{key}=.*Remove {key}"):
        wrapped(gcu2, cfg, ConvBN())
    assert torch_ddp == []


def test_a_user_ddp_subclass_gets_the_device_kwargs(gcu2, torch_ddp, user_ddp):
    name, user_class = user_ddp

    wrapper = wrapped(gcu2, dict(type=name, bucket_cap_mb=10), ConvBN())

    assert type(wrapper) is user_class
    assert torch_ddp == [dict(bucket_cap_mb=10, device_ids=[CARD], output_device=CARD)]


def test_a_user_ddp_subclass_is_refused_on_gcu1(gcu1, torch_ddp, user_ddp):
    name, _ = user_ddp

    with pytest.raises(GCUError) as err:
        wrapped(gcu1, dict(type=name), ConvBN())

    message = str(err.value)
    assert message.startswith("model_wrapper_cfg.type=UserDDP is a torch DistributedDataParallel")
    assert "mmgcu builds GCU1DistributedDataParallel" in message
    assert torch_ddp == []


def test_a_wrapper_that_is_not_ddp_gets_the_module_only(gcu2):
    class Plain(torch.nn.Module):
        def __init__(self, module, **kwargs):
            super().__init__()
            self.module, self.kwargs = module, kwargs

    name = "_MmgcuTestPlainWrapper"
    MODEL_WRAPPERS.register_module(name=name, module=Plain, force=True)
    try:
        wrapper = wrapped(gcu2, dict(type=name, option=1), ConvBN())
    finally:
        MODEL_WRAPPERS._module_dict.pop(name, None)

    assert type(wrapper) is Plain and wrapper.kwargs == dict(option=1)


def test_an_unknown_wrapper_type_is_mmengines_error(gcu2, torch_ddp):
    with pytest.raises(KeyError, match="NoSuchWrapper"):
        wrapped(gcu2, dict(type="NoSuchWrapper"), ConvBN())


class Group:
    """A card group of 8 ranks, as the accelerator would hold after init_process_groups."""

    world_size = 8
    name = "the card group"
    group = None

    def all_reduce(self, tensor):
        raise AssertionError("no collective in wrap")


def grouped(accelerator):
    accelerator.card_group = Group()
    return accelerator


def infos_of(logged):
    return [c.args[0] for c in logged.call_args_list if "level" not in c.kwargs]


@pytest.mark.parametrize("kind", ["gcu2", "gcu1", "cpu"])
@pytest.mark.parametrize("sync_cfg, sync_model", [("torch", False), (None, True)])
def test_sync_bn_becomes_gcu_sync_bn_over_the_card_group(
    kind, sync_cfg, sync_model, request, torch_ddp, logged, monkeypatch
):
    """Without it, SyncBN fails at the first forward (no GCU has torch's kernels) or, reverted
    to BN, each rank normalises over its own two images."""
    accelerator = grouped(request.getfixturevalue(kind) if kind != "cpu" else fakes.cpu())
    cfg = {} if sync_cfg is None else dict(sync_bn=sync_cfg)

    wrapper = wrapped(accelerator, None, ConvBN(sync=sync_model), **cfg)

    (norm,) = [m for m in wrapper.module.modules() if isinstance(m, GCUSyncBatchNorm)]
    assert norm.card_group is accelerator.card_group
    assert warnings_of(logged) == []
    assert any("1 layer(s) synchronised across 8 cards" in m for m in infos_of(logged))


def test_sync_bn_stays_torchs_on_cuda(cuda, torch_ddp, logged):
    wrapper = wrapped(cuda, None, ConvBN(), sync_bn="torch")

    assert norm_types(wrapper.module) == [torch.nn.SyncBatchNorm]
    assert warnings_of(logged) == []


@pytest.mark.parametrize("kind", ["gcu2", "gcu1"])
def test_plain_bn_is_left_alone_without_sync_bn(kind, request, torch_ddp, logged):
    accelerator = grouped(request.getfixturevalue(kind))
    wrapper = wrapped(accelerator, None, ConvBN())

    assert norm_types(wrapper.module) == [torch.nn.BatchNorm2d]
    assert warnings_of(logged) == []
