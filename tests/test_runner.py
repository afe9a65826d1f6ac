"""What GCURunner itself does, on faked vendor modules (no process group is created).

Runners are made with ``object.__new__`` and the attributes mmengine's ``__init__`` would
set before the method under test; mmengine's own part of each method runs unless a test
records it. The vendor modules come from :mod:`tests.fakes`, so ``setup_env`` selects a
real accelerator over them; card choices and group creation are recorded in ``events``.
"""

import datetime
import logging
import os
import os.path as osp
import re
import sys
from unittest import mock

import mmengine.runner.runner as mm_runner
import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import EmptyCacheHook, Hook, RuntimeInfoHook
from mmengine.model import BaseDataPreprocessor, MMDistributedDataParallel
from mmengine.optim import OptimWrapper, OptimWrapperDict
from mmengine.registry import MODEL_WRAPPERS
from mmengine.runner import LogProcessor, Runner, TestLoop, ValLoop

import mmgcu.counterparts as counterparts
import mmgcu.runner as mrunner
from mmgcu import (
    CPUCheckpointHook,
    GCU1DistributedDataParallel,
    GCUAmpOptimWrapper,
    GCUDevicePlacementHook,
    GCUDistributedDataParallel,
    GCUEmptyCacheHook,
    GCULogProcessor,
    GCUOptimWrapper,
    GCUTestLoop,
    GCUValLoop,
)
from mmgcu.counterparts import Counterparts
from mmgcu.device import GCUError
from mmgcu.device.fallback import CPUAccelerator
from mmgcu.model import GCUSyncBatchNorm
from mmgcu.runner import GCURunner
from mmgcu.watchdog import NoWatchdog
from tests import fakes
from tests.conftest import LAUNCHER_VARS, free_port
from tests.fakes import ConvBN, norm_types

CARD = 3

#: The groups each kind creates: torch.distributed's backend (and torch_gcu 1.x's ECCL world).
GROUPS = {
    "gcu2": [("init_process_group", "cpu:gloo,gcu:eccl")],
    "gcu1": [("init_process_group", "gloo"), ("eccl init_process_group", "eccl")],
    "cuda": [("init_process_group", "nccl")],
    "cpu": [("init_process_group", "gloo")],
}


@pytest.fixture(autouse=True)
def launcher_env():
    """No launcher variables; the slurm/mpi set-up writes os.environ, so restore it all."""
    saved = dict(os.environ)
    for name in LAUNCHER_VARS:
        os.environ.pop(name, None)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", RANK="0", WORLD_SIZE="1")
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def no_locks(monkeypatch):
    """The card and work-dir locks setup_env takes are tests/test_locks.py's subject."""
    monkeypatch.setattr(mrunner, "hold_locks", lambda *args: None)


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
def super_setup(monkeypatch, events):
    """mmengine's Runner.setup_env as a recorder of its env_cfg and of when it ran."""
    seen = []

    def record(self, env_cfg):
        events.append(("super",))
        seen.append(dict(env_cfg))
        self._rank, self._world_size = 0, 1

    monkeypatch.setattr(Runner, "setup_env", record)
    return seen


@pytest.fixture
def logged(monkeypatch):
    """mmgcu.runner's print_log as a recorder."""
    recorder = mock.Mock()
    monkeypatch.setattr(mrunner, "print_log", recorder)
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


def make_runner(launcher="none", **cfg):
    runner = object.__new__(GCURunner)
    runner._launcher = launcher
    runner._distributed = launcher != "none"
    runner.cfg = Config(cfg)
    runner._work_dir = "work"  # set by mmengine's __init__ before setup_env
    runner.watchdog = NoWatchdog()  # set by register_hooks; test_watchdog.py tests the real one
    return runner


def placed_runner(accelerator, distributed=True, card=CARD, **cfg):
    """A runner after setup_env: its accelerator on its card, and counterparts."""
    runner = make_runner("pytorch" if distributed else "none", **cfg)
    accelerator.set_device(card)
    runner.accelerator = accelerator
    runner.counterparts = Counterparts(accelerator)
    runner.message_hub = None  # built by Runner.__init__, which these tests skip
    return runner


# -- setup_env ------------------------------------------------------------------------------------


@pytest.mark.parametrize("requested", [None, "nccl"])
@pytest.mark.parametrize("kind", ["gcu2", "gcu1", "cuda", "cpu"])
def test_the_card_is_set_before_the_groups_are_made(
    kind, requested, monkeypatch, events, torch_dist, super_setup
):
    install(kind, monkeypatch, events)
    card = 0 if kind == "cpu" else CARD
    os.environ["LOCAL_RANK"] = str(card)
    dist_cfg = {} if requested is None else dict(backend=requested)
    runner = make_runner("pytorch")

    runner.setup_env(dict(device=kind, dist_cfg=dist_cfg))

    chosen = [] if kind == "cpu" else [("set_device", card)]
    assert events == chosen + GROUPS[kind] + [("super",)]
    assert runner.card == card
    assert runner.accelerator.kind == kind
    assert runner.accelerator.card_group is not None


@pytest.mark.parametrize("kind", ["gcu2", "gcu1"])
def test_auto_finds_the_gcu_and_never_sets_a_cuda_device(
    kind, monkeypatch, events, torch_dist, super_setup
):
    cuda_set_device = mock.Mock()
    monkeypatch.setattr(torch.cuda, "set_device", cuda_set_device)
    install(kind, monkeypatch, events)
    os.environ["LOCAL_RANK"] = "2"
    runner = make_runner("pytorch")

    runner.setup_env(dict(dist_cfg=dict(backend="nccl")))

    assert runner.accelerator.kind == kind
    assert events[0] == ("set_device", 2)
    cuda_set_device.assert_not_called()


def test_the_device_the_config_names_is_used(monkeypatch, events, torch_dist, super_setup):
    install("gcu2", monkeypatch, events)

    runner = make_runner("none")
    runner.setup_env(dict(device="cpu"))

    assert isinstance(runner.accelerator, CPUAccelerator)
    assert events == [("super",)]  # the GCU was not touched


def test_gcu_jit_mode_reaches_the_accelerator(monkeypatch, events, torch_dist, super_setup):
    install("gcu1", monkeypatch, events)
    runner = make_runner("none")
    runner.setup_env(dict(gcu_jit_mode="SYNC"))
    assert runner.accelerator.summary()["jit_mode"] == "SYNC"


def test_gloo_is_refused_on_gcu2(monkeypatch, events, torch_dist, super_setup):
    install("gcu2", monkeypatch, events)
    os.environ["LOCAL_RANK"] = "0"

    with pytest.raises(GCUError, match="'gloo' cannot carry GCU tensors"):
        make_runner("pytorch").setup_env(dict(dist_cfg=dict(backend="gloo")))

    assert not torch_dist["initialized"]
    assert ("super",) not in events


@pytest.mark.parametrize("kind", ["gcu1", "cpu"])
def test_gloo_is_kept_where_it_is_the_default_group(
    kind, monkeypatch, events, torch_dist, super_setup
):
    install(kind, monkeypatch, events)
    os.environ["LOCAL_RANK"] = "0"

    make_runner("pytorch").setup_env(dict(device=kind, dist_cfg=dict(backend="gloo")))

    assert ("init_process_group", "gloo") in events


def test_gcu2_without_eccl_stops_before_the_group(monkeypatch, events, torch_dist, super_setup):
    install("gcu2", monkeypatch, events, eccl=False)
    os.environ["LOCAL_RANK"] = "0"

    with pytest.raises(GCUError, match="ECCL is not available"):
        make_runner("pytorch").setup_env({})

    assert not torch_dist["initialized"]


def test_dist_cfg_timeout_reaches_both_groups(monkeypatch, events, torch_dist, super_setup):
    accelerator = install("gcu1", monkeypatch, events)
    os.environ["LOCAL_RANK"] = "0"

    make_runner("pytorch").setup_env(dict(dist_cfg=dict(backend="nccl", timeout=1800)))

    timeout = datetime.timedelta(seconds=1800)
    assert torch_dist["kwargs"]["timeout"] == timeout
    eccl = accelerator.torch_gcu.distributed.init_process_group.call_args.kwargs
    assert eccl["timeout"] == timeout


def test_a_missing_local_rank_is_named(monkeypatch, events, torch_dist, super_setup):
    install("gcu2", monkeypatch, events)

    with pytest.raises(GCUError, match="LOCAL_RANK is not set"):
        make_runner("pytorch").setup_env({})

    assert events == []


def test_a_local_rank_without_a_card_stops_before_the_group(
    monkeypatch, events, torch_dist, super_setup
):
    install("gcu2", monkeypatch, events, cards=4)
    os.environ["LOCAL_RANK"] = "4"

    with pytest.raises(GCUError, match=r"local rank 4 has no card.*0\.\.3"):
        make_runner("pytorch").setup_env({})

    assert events == []


def test_a_group_the_caller_made_is_adopted(monkeypatch, events, torch_dist, super_setup):
    install("gcu2", monkeypatch, events, current=5)
    torch_dist["initialized"] = True

    runner = make_runner("pytorch")
    runner.setup_env(dict(dist_cfg=dict(backend="nccl")))

    assert runner.card == 5
    assert events == [("super",)]
    assert runner.accelerator.card_group.dist is torch.distributed


def test_gcu1_needs_the_eccl_world_when_the_caller_made_the_group(
    monkeypatch, events, torch_dist, super_setup
):
    install("gcu1", monkeypatch, events)
    torch_dist["initialized"] = True

    with pytest.raises(GCUError, match="torch_gcu.distributed was not"):
        make_runner("pytorch").setup_env({})


@pytest.mark.parametrize("kind", ["gcu2", "gcu1", "cuda", "cpu"])
def test_a_single_process_uses_card_zero_without_a_group(
    kind, monkeypatch, events, torch_dist, super_setup
):
    install(kind, monkeypatch, events, **({} if kind == "cpu" else dict(current=6)))
    runner = make_runner("none")

    runner.setup_env(dict(device=kind, dist_cfg=dict(backend="nccl")))

    chosen = [] if kind == "cpu" else [("set_device", 0)]
    assert events == chosen + [("super",)]
    assert runner.card == 0 and runner.accelerator.card_group is None


def test_slurm_environment_becomes_torch_environment(monkeypatch, events, torch_dist, super_setup):
    install("gcu2", monkeypatch, events)
    for name in ("RANK", "WORLD_SIZE"):
        os.environ.pop(name)
    os.environ.update(SLURM_PROCID="5", SLURM_NTASKS="16", SLURM_LOCALID="1", MASTER_ADDR="node0")
    runner = make_runner("slurm")

    runner.setup_env(dict(dist_cfg=dict(backend="nccl", port=29999)))

    assert events == [("set_device", 1)] + GROUPS["gcu2"] + [("super",)]
    assert runner.card == 1
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("5", "16")
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("node0", "29999")
    assert "port" not in torch_dist["kwargs"]


def test_slurm_without_srun_variables_is_refused(monkeypatch, events, torch_dist, super_setup):
    install("gcu2", monkeypatch, events)

    with pytest.raises(GCUError, match="SLURM_PROCID, SLURM_NTASKS is not set"):
        make_runner("slurm").setup_env({})

    assert events == []


def test_mpi_environment_becomes_torch_environment(monkeypatch, events, torch_dist, super_setup):
    install("gcu1", monkeypatch, events)
    os.environ.update(
        OMPI_COMM_WORLD_RANK="6", OMPI_COMM_WORLD_SIZE="8", OMPI_COMM_WORLD_LOCAL_RANK="2"
    )
    runner = make_runner("mpi")

    runner.setup_env(dict(dist_cfg=dict(backend="nccl")))

    assert events == [("set_device", 2)] + GROUPS["gcu1"] + [("super",)]
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == (
        "6",
        "8",
        "2",
    )


def test_an_unknown_launcher_is_refused(monkeypatch, events, torch_dist, super_setup):
    install("gcu2", monkeypatch, events)

    with pytest.raises(GCUError, match="unknown launcher 'lsf'"):
        make_runner("lsf").setup_env({})

    assert not torch_dist["initialized"]


@pytest.mark.parametrize("kind", ["gcu2", "gcu1", "cpu"])
def test_cudnn_benchmark_is_dropped_off_cuda(kind, monkeypatch, events, torch_dist, super_setup):
    install(kind, monkeypatch, events)
    env_cfg = dict(device=kind, cudnn_benchmark=True, mp_cfg=dict(opencv_num_threads=0))

    make_runner("none").setup_env(env_cfg)

    assert super_setup == [dict(device=kind, mp_cfg=dict(opencv_num_threads=0))]
    assert env_cfg["cudnn_benchmark"] is True  # the caller's dict is not changed


def test_cudnn_benchmark_is_kept_on_cuda(monkeypatch, events, torch_dist, super_setup):
    install("cuda", monkeypatch, events)

    make_runner("none").setup_env(dict(cudnn_benchmark=True))

    assert super_setup == [dict(cudnn_benchmark=True)]


def test_mmengines_setup_runs_after_the_group(monkeypatch, events, torch_dist):
    install("gcu2", monkeypatch, events)
    os.environ["LOCAL_RANK"] = "3"
    calls = mock.Mock()
    monkeypatch.setattr(mm_runner, "set_multi_processing", calls.set_multi_processing)
    monkeypatch.setattr(mm_runner, "init_dist", calls.init_dist)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    broadcasts = []

    def get_dist_info():
        assert torch_dist["initialized"], "mmengine read rank/world size before the group"
        return 11, 16

    monkeypatch.setattr(mm_runner, "get_dist_info", get_dist_info)
    monkeypatch.setattr(mm_runner, "broadcast", lambda t, *a, **k: broadcasts.append(t))
    runner = make_runner("pytorch")
    mmseg_env = dict(
        cudnn_benchmark=True,
        mp_cfg=dict(mp_start_method="fork", opencv_num_threads=0),
        dist_cfg=dict(backend="nccl"),
    )

    runner.setup_env(mmseg_env)

    assert events == [("set_device", 3)] + GROUPS["gcu2"]
    assert (runner.rank, runner.world_size) == (11, 16)
    assert re.fullmatch(r"\d{8}_\d{6}", runner.timestamp)
    assert [t.dtype for t in broadcasts] == [torch.float64]
    calls.init_dist.assert_not_called()  # stock init_dist would call torch.cuda.set_device
    calls.set_multi_processing.assert_called_once_with(
        mp_start_method="fork", opencv_num_threads=0, distributed=True
    )
    assert torch.backends.cudnn.benchmark is False


# -- seeding -------------------------------------------------------------------------------------


@pytest.mark.parametrize("diff_rank_seed", [False, True])
def test_set_randomness_seeds_the_cards(monkeypatch, diff_rank_seed):
    """torch_gcu 1.x is not reached by torch.manual_seed: the runner seeds the cards."""
    accelerator = fakes.gcu1(monkeypatch)
    runner = placed_runner(accelerator)
    monkeypatch.setattr("mmengine.runner.utils.get_rank", lambda: 3)

    runner.set_randomness(seed=7, diff_rank_seed=diff_rank_seed)

    expected = 7 + 3 if diff_rank_seed else 7
    assert runner.seed == expected
    accelerator.torch_gcu.manual_seed_all.assert_called_once_with(expected)


# -- wrap_model ------------------------------------------------------------------------------------


@pytest.fixture
def torch_ddp(monkeypatch):
    return fakes.record_torch_ddp(monkeypatch)


@pytest.fixture
def gcu2(monkeypatch):
    return fakes.gcu2(monkeypatch, current=CARD, on_cpu=True)


@pytest.fixture
def gcu1(monkeypatch):
    accelerator = fakes.gcu1(monkeypatch, current=CARD, on_cpu=True)
    accelerator.torch_gcu.distributed.group.WORLD = object()
    accelerator.adopt_process_groups()
    return accelerator


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
    placed = placed_runner(fakes.cpu(), distributed=False, card=0).wrap_model(
        None, ConvBN(sync=True)
    )

    assert not isinstance(placed, MMDistributedDataParallel)
    assert reverted(placed)


def test_a_single_process_moves_the_model_to_its_card(gcu2, monkeypatch):
    model = ConvBN()
    to = mock.Mock(wraps=model.to)
    monkeypatch.setattr(model, "to", to)

    placed = placed_runner(gcu2, distributed=False, card=0).wrap_model(None, model)

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

    placed_runner(accelerator, distributed=False, card=0).wrap_model(None, model)

    assert model.linear.weight.device.type == "meta"
    with pytest.raises(GCUError, match="returned a batch on cpu, but the model is on meta"):
        model.data_preprocessor({"inputs": torch.ones(1)})


def test_distributed_moves_the_model_before_wrapping(gcu2, monkeypatch, torch_ddp):
    model = ConvBN()
    to = mock.Mock(wraps=model.to)
    monkeypatch.setattr(model, "to", to)

    wrapper = placed_runner(gcu2).wrap_model(None, model)

    assert gcu2.device.call_args_list[0] == mock.call(CARD)
    to.assert_called_once_with(gcu2.device.return_value)
    assert wrapper.module is model


def test_a_wrapped_model_is_returned_unchanged(gcu2, torch_ddp):
    wrapper = GCUDistributedDataParallel(ConvBN(), gcu2)
    gcu2.device.reset_mock()

    assert placed_runner(gcu2).wrap_model(None, wrapper) is wrapper
    gcu2.device.assert_not_called()


def test_a_missing_cfg_gets_mmengines_defaults(gcu2, torch_ddp):
    wrapper = placed_runner(gcu2).wrap_model(None, ConvBN())

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
    placed_runner(gcu2, find_unused_parameters=True).wrap_model(None, ConvBN())

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

    on_gcu2 = placed_runner(gcu2).wrap_model(given, ConvBN())
    on_gcu1 = placed_runner(gcu1).wrap_model(given, ConvBN())

    assert type(on_gcu2) is GCUDistributedDataParallel
    assert torch_ddp == [dict(broadcast_buffers=True, device_ids=[CARD], output_device=CARD)]
    assert type(on_gcu1) is GCU1DistributedDataParallel
    assert on_gcu1.ddp.kwargs == dict(
        broadcast_buffers=True, device_ids=[CARD], process_group=gcu1.card_group.group
    )
    assert given == dict(type=stock, broadcast_buffers=True)  # the config is not changed


def test_a_cfg_without_type_becomes_the_accelerators_wrapper(gcu2, torch_ddp):
    wrapper = placed_runner(gcu2).wrap_model(dict(find_unused_parameters=True), ConvBN())

    assert type(wrapper) is GCUDistributedDataParallel
    assert torch_ddp[0]["find_unused_parameters"] is True
    assert "broadcast_buffers" not in torch_ddp[0]


@pytest.mark.parametrize(
    "key,value", [("device_ids", [CARD]), ("device_ids", [0]), ("output_device", CARD)]
)
def test_config_device_ids_are_refused(gcu2, torch_ddp, key, value):
    cfg = dict(type="MMDistributedDataParallel", **{key: value})

    with pytest.raises(GCUError, match=f"model_wrapper_cfg.{key}=.*Remove {key}"):
        placed_runner(gcu2).wrap_model(cfg, ConvBN())
    assert torch_ddp == []


def test_a_user_ddp_subclass_gets_the_device_kwargs(gcu2, torch_ddp, user_ddp):
    name, user_class = user_ddp

    wrapper = placed_runner(gcu2).wrap_model(dict(type=name, bucket_cap_mb=10), ConvBN())

    assert type(wrapper) is user_class
    assert torch_ddp == [dict(bucket_cap_mb=10, device_ids=[CARD], output_device=CARD)]


def test_a_user_ddp_subclass_is_refused_on_gcu1(gcu1, torch_ddp, user_ddp):
    name, _ = user_ddp

    with pytest.raises(GCUError) as err:
        placed_runner(gcu1).wrap_model(dict(type=name), ConvBN())

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
        wrapper = placed_runner(gcu2).wrap_model(dict(type=name, option=1), ConvBN())
    finally:
        MODEL_WRAPPERS._module_dict.pop(name, None)

    assert type(wrapper) is Plain and wrapper.kwargs == dict(option=1)


def test_an_unknown_wrapper_type_is_mmengines_error(gcu2, torch_ddp):
    with pytest.raises(KeyError, match="NoSuchWrapper"):
        placed_runner(gcu2).wrap_model(dict(type="NoSuchWrapper"), ConvBN())


class Group:
    """A card group of 8 ranks, as the accelerator would hold after init_process_groups."""

    world_size = 8
    name = "the card group"
    group = None

    def all_reduce(self, tensor):
        raise AssertionError("no collective in wrap_model")


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

    wrapper = placed_runner(accelerator, **cfg).wrap_model(None, ConvBN(sync=sync_model))

    (norm,) = [m for m in wrapper.module.modules() if isinstance(m, GCUSyncBatchNorm)]
    assert norm.card_group is accelerator.card_group
    assert warnings_of(logged) == []
    assert any("1 layer(s) synchronised across 8 cards" in m for m in infos_of(logged))


def test_sync_bn_stays_torchs_on_cuda(cuda, torch_ddp, logged):
    wrapper = placed_runner(cuda, sync_bn="torch").wrap_model(None, ConvBN())

    assert norm_types(wrapper.module) == [torch.nn.SyncBatchNorm]
    assert warnings_of(logged) == []


@pytest.mark.parametrize("kind", ["gcu2", "gcu1"])
def test_plain_bn_is_left_alone_without_sync_bn(kind, request, torch_ddp, logged):
    accelerator = grouped(request.getfixturevalue(kind))
    wrapper = placed_runner(accelerator).wrap_model(None, ConvBN())

    assert norm_types(wrapper.module) == [torch.nn.BatchNorm2d]
    assert warnings_of(logged) == []


# -- what mmengine builds from the config ---------------------------------------------------------


def sgd_cfg(**kwargs):
    return dict(optimizer=dict(type="SGD", lr=0.1), **kwargs)


def test_optim_wrappers_become_gcu_ones_bound_to_the_card(monkeypatch):
    accelerator = fakes.gcu1(monkeypatch, on_cpu=True)
    runner = placed_runner(accelerator)
    runner.model = ConvBN()

    plain = runner.build_optim_wrapper(sgd_cfg())
    amp = runner.build_optim_wrapper(sgd_cfg(type="AmpOptimWrapper", dtype="bfloat16"))

    assert type(plain) is GCUOptimWrapper and type(amp) is GCUAmpOptimWrapper
    for wrapper in (plain, amp):
        assert (wrapper.accelerator, wrapper.model) == (accelerator, runner.model)
    assert isinstance(amp.loss_scaler, fakes.FakeGradScaler)
    assert amp.cast_dtype is torch.bfloat16


def test_optim_wrappers_stay_stock_off_a_gcu():
    runner = placed_runner(fakes.cpu())
    runner.model = ConvBN()
    assert type(runner.build_optim_wrapper(sgd_cfg())) is OptimWrapper


def test_built_gcu_optim_wrappers_are_bound_too(monkeypatch):
    accelerator = fakes.gcu1(monkeypatch, on_cpu=True)
    runner = placed_runner(accelerator)
    runner.model = ConvBN()
    first = GCUOptimWrapper(optimizer=torch.optim.SGD(runner.model.parameters(), lr=0.1))
    second = GCUAmpOptimWrapper(optimizer=torch.optim.SGD(runner.model.parameters(), lr=0.1))

    built = runner.build_optim_wrapper(dict(first=first, second=second))

    assert isinstance(built, OptimWrapperDict)
    assert all(w.accelerator is accelerator and w.model is runner.model for w in (first, second))
    assert runner.build_optim_wrapper(first) is first


def test_a_built_stock_optim_wrapper_on_a_gcu_is_warned(monkeypatch):
    warned = mock.Mock()
    monkeypatch.setattr(counterparts, "print_log", warned)
    runner = placed_runner(fakes.gcu1(monkeypatch, on_cpu=True))
    runner.model = ConvBN()

    runner.build_optim_wrapper(OptimWrapper(torch.optim.SGD(runner.model.parameters(), lr=0.1)))

    said = [call.args[0] for call in warned.call_args_list]
    assert len(said) == 1 and "an already built OptimWrapper was given" in said[0]


@pytest.mark.parametrize(
    "method, given, gcu_class, stock_class",
    [
        ("build_val_loop", dict(type="ValLoop", fp16=True), GCUValLoop, ValLoop),
        ("build_val_loop", dict(fp16=True), GCUValLoop, ValLoop),
        ("build_test_loop", dict(type="TestLoop"), GCUTestLoop, TestLoop),
        ("build_test_loop", dict(), GCUTestLoop, TestLoop),
        ("build_log_processor", dict(by_epoch=False), GCULogProcessor, LogProcessor),
    ],
)
@pytest.mark.parametrize("kind", ["gcu2", "cpu"])
def test_loops_and_the_log_processor_resolve_their_counterparts(
    monkeypatch, method, given, gcu_class, stock_class, kind
):
    built = []
    monkeypatch.setattr(Runner, method, lambda self, cfg: built.append(cfg) or cfg)
    runner = placed_runner(fakes.ACCELERATORS[kind](monkeypatch))

    getattr(runner, method)(given)

    (cfg,) = built
    assert cfg["type"] is (gcu_class if kind == "gcu2" else stock_class)
    assert {k: v for k, v in cfg.items() if k != "type"} == {
        k: v for k, v in given.items() if k != "type"
    }


def test_a_built_loop_passes_through(monkeypatch):
    monkeypatch.setattr(Runner, "build_val_loop", lambda self, loop: loop)
    loop = object()
    assert placed_runner(fakes.cpu()).build_val_loop(loop) is loop


def hooked_runner(accelerator, **cfg):
    runner = placed_runner(accelerator, distributed=False, **cfg)
    runner._hooks = []
    return runner


@pytest.mark.parametrize("kind, expected", [("gcu2", GCUEmptyCacheHook), ("cpu", EmptyCacheHook)])
def test_hooks_resolve_their_counterparts(monkeypatch, kind, expected):
    runner = hooked_runner(fakes.ACCELERATORS[kind](monkeypatch))

    runner.register_hook(dict(type="EmptyCacheHook", after_iter=True, priority="LOW"))

    (hook,) = runner.hooks
    assert type(hook) is expected and hook.priority == "LOW"


def test_register_hooks_adds_the_checkpoint_and_placement_hooks():
    runner = hooked_runner(fakes.cpu())

    runner.register_hooks()

    types = [type(h) for h in runner.hooks]
    assert types[:2] == [RuntimeInfoHook, GCUDevicePlacementHook]  # VERY_HIGH
    assert types[-1] is CPUCheckpointHook  # LOWEST: after what other hooks add
    assert len(types) == 8  # mmengine's six default hooks are still there


@pytest.mark.parametrize(
    "listed", [dict(type="GCUDevicePlacementHook"), GCUDevicePlacementHook()], ids=["cfg", "obj"]
)
@pytest.mark.parametrize("kind", ["gcu2", "cpu"])
def test_register_hooks_keeps_a_listed_placement_hook(listed, kind, monkeypatch):
    runner = hooked_runner(fakes.ACCELERATORS[kind](monkeypatch))

    runner.register_hooks(custom_hooks=[listed])

    assert [type(h) for h in runner.hooks].count(GCUDevicePlacementHook) == 1


def test_register_hooks_without_the_placement_check():
    runner = hooked_runner(fakes.cpu(), gcu_placement_check=False)

    runner.register_hooks()

    types = [type(h) for h in runner.hooks]
    assert GCUDevicePlacementHook not in types and types[-1] is CPUCheckpointHook


def test_hooks_given_as_objects_are_kept(monkeypatch):
    runner = hooked_runner(fakes.gcu2(monkeypatch))
    mine = Hook()
    runner.register_hook(mine)
    assert runner.hooks == [mine]


# -- checkpoints ----------------------------------------------------------------------------------


@pytest.fixture
def stock_save(monkeypatch):
    """mmengine's save_checkpoint as a writer of ``out_dir/filename`` (or a failure)."""
    calls = []

    def save(self, out_dir, filename, *args, **kwargs):
        calls.append((out_dir, filename, args, kwargs))
        with open(osp.join(out_dir, filename), "w") as f:
            f.write("partial" if stock_save.fail else "new")
        if stock_save.fail:
            raise stock_save.fail

    stock_save.fail = None
    monkeypatch.setattr(Runner, "save_checkpoint", save)
    save.calls = calls
    return stock_save


def test_a_checkpoint_is_written_then_renamed(tmp_path, stock_save):
    (tmp_path / "iter_4.pth").write_text("old")

    make_runner().save_checkpoint(str(tmp_path), "iter_4.pth", save_optimizer=False)

    assert (tmp_path / "iter_4.pth").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["iter_4.pth"]


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, stock_save):
    (tmp_path / "iter_4.pth").write_text("old")
    stock_save.fail = OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        make_runner().save_checkpoint(str(tmp_path), "iter_4.pth")

    assert (tmp_path / "iter_4.pth").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["iter_4.pth"]  # the partial file is gone


def test_a_remote_checkpoint_is_written_by_its_backend(monkeypatch):
    calls = []
    monkeypatch.setattr(Runner, "save_checkpoint", lambda self, *a, **k: calls.append(a))
    make_runner().save_checkpoint("s3://bucket/work", "iter_4.pth")
    assert calls == [("s3://bucket/work", "iter_4.pth")]


def test_only_rank_0_writes(tmp_path, monkeypatch, stock_save):
    monkeypatch.setattr("mmengine.dist.utils.get_rank", lambda group=None: 1)
    make_runner().save_checkpoint(str(tmp_path), "iter_4.pth")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("previous", [None, "0"])
def test_loading_keeps_torchs_weights_only_check(monkeypatch, previous):
    """Loading allow-lists mmengine's globals for that load; it never turns torch's
    weights-only check off for the process (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD)."""
    name = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
    if previous is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, previous)
    seen = []
    monkeypatch.setattr(
        Runner, "load_checkpoint", lambda self, *a, **k: seen.append(os.environ.get(name)) or "ck"
    )

    assert make_runner().load_checkpoint("work/iter_4.pth", map_location="cpu") == "ck"

    assert seen == [previous]
    assert os.environ.get(name) == previous


# -- a rank whose collective lost a peer ----------------------------------------------------------

PEER_GONE = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [::1]:24968")


def failing_runner(method, error, launcher, monkeypatch):
    runner = make_runner(launcher)
    runner._rank = 1
    runner.logger = mock.Mock()
    monkeypatch.setattr(Runner, method, mock.Mock(side_effect=error))
    sleeps = []
    monkeypatch.setattr("mmgcu.runner.time.sleep", sleeps.append)
    return runner, sleeps


@pytest.mark.parametrize("method", ["train", "val", "test"])
def test_a_rank_that_lost_a_peer_waits_for_the_launcher(method, monkeypatch):
    runner, sleeps = failing_runner(method, PEER_GONE, "pytorch", monkeypatch)

    with pytest.raises(RuntimeError) as raised:
        getattr(runner, method)()

    assert raised.value is PEER_GONE
    assert sleeps == [GCURunner.peer_loss_grace_s]
    fmt, *args = runner.logger.error.call_args.args
    line = fmt % tuple(args)
    assert line.startswith("rank 1: a collective failed because another rank stopped")
    assert "Connection closed by peer" in line


@pytest.mark.skipif(not hasattr(torch.distributed, "DistBackendError"), reason="torch < 2.1")
def test_a_backend_error_without_a_message_is_reraised(monkeypatch):
    error = torch.distributed.DistBackendError("")
    runner, sleeps = failing_runner("train", error, "pytorch", monkeypatch)

    with pytest.raises(torch.distributed.DistBackendError) as raised:
        runner.train()

    assert raised.value is error
    assert sleeps == [GCURunner.peer_loss_grace_s]


@pytest.mark.parametrize(
    "error,launcher",
    [(RuntimeError("injected fault"), "pytorch"), (PEER_GONE, "none")],
    ids=["own-error", "single-process"],
)
def test_a_rank_that_failed_itself_exits_at_once(error, launcher, monkeypatch):
    runner, sleeps = failing_runner("train", error, launcher, monkeypatch)

    with pytest.raises(RuntimeError) as raised:
        runner.train()

    assert raised.value is error
    assert sleeps == []
    runner.logger.error.assert_not_called()


@pytest.mark.parametrize("method", ["train", "val", "test"])
def test_the_result_is_mmengines(method, monkeypatch):
    result = object()
    monkeypatch.setattr(Runner, method, lambda self: result)

    assert getattr(make_runner("pytorch"), method)() is result
