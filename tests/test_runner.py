"""GCURunner.setup_env, _log_env and register_hooks, on faked torch_gcu generations.

No process group is created: ``torch.distributed.init_process_group``/``new_group``/
``is_initialized`` are recorders, and mmengine's own set-up runs on top of them.
"""

import datetime
import os
import re
from unittest import mock

import mmengine.runner.runner as mm_runner
import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

from mmgcu import dist as mdist
from mmgcu.device import GCUError, reset_backend
from mmgcu.device.fallback import CpuBackend
from mmgcu.hooks import GCUDevicePlacementHook
from mmgcu.runner import GCURunner
from tests.conftest import LAUNCHER_VARS
from tests.model.fakes import INSTALL, install_cpu, install_cuda, install_legacy, install_v2

#: The ``init_process_group`` backend (and device-group backend) of each generation.
GROUP_BACKEND = {
    "v2": ("cpu:gloo,gcu:eccl", None),
    "legacy": ("gloo", "eccl"),
    "cuda": ("nccl", None),
    "cpu": ("gloo", None),
}


@pytest.fixture(autouse=True)
def fresh_backend():
    reset_backend()
    yield
    reset_backend()


@pytest.fixture(autouse=True)
def launcher_env(monkeypatch):
    """No launcher variables; the slurm/mpi set-up writes os.environ, so restore it all."""
    saved = dict(os.environ)
    for name in LAUNCHER_VARS:
        os.environ.pop(name, None)
    monkeypatch.setattr(mdist, "_device_group", None)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def events():
    return []


@pytest.fixture
def cuda_set_device(monkeypatch):
    """torch.cuda.set_device as a recorder (stock mmengine calls it, seed 002)."""
    recorder = mock.Mock()
    monkeypatch.setattr(torch.cuda, "set_device", recorder)
    return recorder


class FakeDist:
    """Records init_process_group/new_group into ``events``; is_initialized follows them."""

    def __init__(self, events):
        self.events = events
        self.initialized = False
        self.init_kwargs = None
        self.group_kwargs = None
        self.group = object()

    def init_process_group(self, backend=None, **kwargs):
        assert not self.initialized, "init_process_group called twice"
        self.events.append(("init_process_group", backend))
        self.init_kwargs = kwargs
        self.initialized = True

    def new_group(self, ranks=None, timeout=None, backend=None, **kwargs):
        assert self.initialized, "new_group before init_process_group"
        self.events.append(("new_group", backend))
        self.group_kwargs = dict(ranks=ranks, timeout=timeout, **kwargs)
        return self.group

    def is_initialized(self):
        return self.initialized


@pytest.fixture
def fake_dist(monkeypatch, events):
    fake = FakeDist(events)
    monkeypatch.setattr(torch.distributed, "init_process_group", fake.init_process_group)
    monkeypatch.setattr(torch.distributed, "new_group", fake.new_group)
    monkeypatch.setattr(torch.distributed, "is_initialized", fake.is_initialized)
    return fake


@pytest.fixture
def super_setup(monkeypatch, events):
    """mmengine's Runner.setup_env as a recorder of its env_cfg and of when it ran."""
    seen = []

    def record(self, env_cfg):
        events.append(("super",))
        seen.append(dict(env_cfg))

    monkeypatch.setattr(Runner, "setup_env", record)
    return seen


def make_runner(launcher="none", **cfg):
    runner = object.__new__(GCURunner)
    runner._launcher = launcher
    runner._distributed = launcher != "none"
    runner.cfg = Config(cfg)
    return runner


def install(name, monkeypatch, events, **kwargs):
    return INSTALL[name](monkeypatch, events=events, **kwargs)


def expected_events(generation, card):
    group, device_group = GROUP_BACKEND[generation]
    chosen = [] if generation == "cpu" else [("set_device", card)]
    made = [("init_process_group", group)]
    if device_group:
        made.append(("new_group", device_group))
    return chosen + made + [("super",)]


# -- setup_env: pytorch launcher -------------------------------------------------


@pytest.mark.parametrize("requested", [None, "nccl"])
@pytest.mark.parametrize("generation", ["v2", "legacy", "cuda", "cpu"])
def test_card_is_set_before_the_group_is_created(
    generation, requested, monkeypatch, events, fake_dist, super_setup
):
    card = 0 if generation == "cpu" else 3
    backend = install(generation, monkeypatch, events)
    os.environ["LOCAL_RANK"] = str(card)
    dist_cfg = {} if requested is None else dict(backend=requested)
    runner = make_runner("pytorch")

    runner.setup_env(dict(dist_cfg=dist_cfg))

    assert events == expected_events(generation, card)
    assert runner.card == card
    assert runner.device_backend is backend


@pytest.mark.parametrize("generation", ["v2", "legacy"])
def test_gcu_never_calls_torch_cuda_set_device(
    generation, monkeypatch, events, fake_dist, super_setup, cuda_set_device
):
    install(generation, monkeypatch, events)
    os.environ["LOCAL_RANK"] = "2"

    make_runner("pytorch").setup_env(dict(dist_cfg=dict(backend="nccl")))

    assert ("init_process_group", GROUP_BACKEND[generation][0]) in events
    cuda_set_device.assert_not_called()


def test_cuda_fallback_does_set_the_cuda_device(monkeypatch, events, fake_dist, super_setup):
    install_cuda(monkeypatch, events=events)
    os.environ["LOCAL_RANK"] = "1"

    make_runner("pytorch").setup_env(dict(dist_cfg=dict(backend="nccl")))

    torch.cuda.set_device.assert_called_once_with(1)


def test_legacy_keeps_the_eccl_group_for_card_tensors(monkeypatch, events, fake_dist, super_setup):
    install_legacy(monkeypatch, events=events)
    os.environ["LOCAL_RANK"] = "0"

    make_runner("pytorch").setup_env(dict(dist_cfg=dict(backend="nccl")))

    assert mdist.device_group() is fake_dist.group


def test_v2_has_no_separate_device_group(monkeypatch, events, fake_dist, super_setup):
    install_v2(monkeypatch, events=events)
    os.environ["LOCAL_RANK"] = "0"

    make_runner("pytorch").setup_env({})

    assert mdist.device_group() is None
    assert not any(e[0] == "new_group" for e in events)


def test_gloo_is_refused_on_v2(monkeypatch, events, fake_dist, super_setup):
    install_v2(monkeypatch, events=events)
    os.environ["LOCAL_RANK"] = "0"

    with pytest.raises(GCUError, match="'gloo' cannot carry GCU tensors"):
        make_runner("pytorch").setup_env(dict(dist_cfg=dict(backend="gloo")))

    assert not fake_dist.initialized
    assert ("super",) not in events


@pytest.mark.parametrize("generation", ["legacy", "cpu"])
def test_gloo_is_kept_where_it_is_the_default_group(
    generation, monkeypatch, events, fake_dist, super_setup
):
    install(generation, monkeypatch, events)
    os.environ["LOCAL_RANK"] = "0"

    make_runner("pytorch").setup_env(dict(dist_cfg=dict(backend="gloo")))

    assert ("init_process_group", "gloo") in events


def test_v2_without_eccl_stops_before_the_group(monkeypatch, events, fake_dist, super_setup):
    install_v2(monkeypatch, events=events, eccl=False)
    os.environ["LOCAL_RANK"] = "0"

    with pytest.raises(GCUError, match="ECCL is not available"):
        make_runner("pytorch").setup_env({})

    assert not fake_dist.initialized


def test_dist_cfg_timeout_reaches_both_groups(monkeypatch, events, fake_dist, super_setup):
    install_legacy(monkeypatch, events=events)
    os.environ["LOCAL_RANK"] = "0"

    make_runner("pytorch").setup_env(dict(dist_cfg=dict(backend="nccl", timeout=1800)))

    assert fake_dist.init_kwargs == dict(timeout=datetime.timedelta(seconds=1800))
    assert fake_dist.group_kwargs["timeout"] == datetime.timedelta(seconds=1800)


def test_missing_local_rank_is_named(monkeypatch, events, fake_dist, super_setup):
    install_v2(monkeypatch, events=events)

    with pytest.raises(GCUError, match="LOCAL_RANK is not set"):
        make_runner("pytorch").setup_env({})

    assert events == []


def test_local_rank_without_a_card_stops_before_the_group(
    monkeypatch, events, fake_dist, super_setup
):
    install_v2(monkeypatch, cards=4, events=events)
    os.environ["LOCAL_RANK"] = "4"

    with pytest.raises(GCUError, match=r"local rank 4 has no card.*0\.\.3"):
        make_runner("pytorch").setup_env({})

    assert events == []


def test_group_made_by_the_caller_is_kept(monkeypatch, events, fake_dist, super_setup):
    install_v2(monkeypatch, current=5, events=events)
    fake_dist.initialized = True

    runner = make_runner("pytorch")
    runner.setup_env(dict(dist_cfg=dict(backend="nccl")))

    assert runner.card == 5
    assert events == [("super",)]


# -- setup_env: launcher none ------------------------------------------------------


@pytest.mark.parametrize("generation", ["v2", "legacy", "cuda", "cpu"])
def test_single_process_uses_card_zero_without_a_group(
    generation, monkeypatch, events, fake_dist, super_setup
):
    install(generation, monkeypatch, events, **({} if generation == "cpu" else dict(current=6)))
    runner = make_runner("none")

    runner.setup_env(dict(dist_cfg=dict(backend="nccl")))

    chosen = [] if generation == "cpu" else [("set_device", 0)]
    assert events == chosen + [("super",)]
    assert runner.card == 0


# -- setup_env: slurm and mpi --------------------------------------------------------


def test_slurm_environment_becomes_torch_environment(monkeypatch, events, fake_dist, super_setup):
    install_v2(monkeypatch, events=events)
    os.environ.update(SLURM_PROCID="5", SLURM_NTASKS="16", SLURM_LOCALID="1", MASTER_ADDR="node0")
    runner = make_runner("slurm")

    runner.setup_env(dict(dist_cfg=dict(backend="nccl", port=29999)))

    assert events == expected_events("v2", 1)
    assert runner.card == 1
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("5", "16")
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("node0", "29999")
    assert "port" not in fake_dist.init_kwargs


def test_slurm_without_srun_variables_is_refused(monkeypatch, events, fake_dist, super_setup):
    install_v2(monkeypatch, events=events)

    with pytest.raises(GCUError, match="SLURM_PROCID, SLURM_NTASKS is not set"):
        make_runner("slurm").setup_env({})

    assert events == []


def test_mpi_environment_becomes_torch_environment(monkeypatch, events, fake_dist, super_setup):
    install_legacy(monkeypatch, events=events)
    os.environ.update(
        OMPI_COMM_WORLD_RANK="6", OMPI_COMM_WORLD_SIZE="8", OMPI_COMM_WORLD_LOCAL_RANK="2"
    )
    runner = make_runner("mpi")

    runner.setup_env(dict(dist_cfg=dict(backend="nccl")))

    assert events == expected_events("legacy", 2)
    assert runner.card == 2
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == (
        "6",
        "8",
        "2",
    )
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"


def test_unknown_launcher_is_refused(monkeypatch, events, fake_dist, super_setup):
    install_v2(monkeypatch, events=events)

    with pytest.raises(GCUError, match="unknown launcher 'lsf'"):
        make_runner("lsf").setup_env({})

    assert not fake_dist.initialized


# -- setup_env: what reaches mmengine ------------------------------------------------


@pytest.mark.parametrize("generation", ["v2", "legacy", "cpu"])
def test_cudnn_benchmark_is_dropped_off_cuda(
    generation, monkeypatch, events, fake_dist, super_setup
):
    install(generation, monkeypatch, events)
    env_cfg = dict(cudnn_benchmark=True, mp_cfg=dict(opencv_num_threads=0))

    make_runner("none").setup_env(env_cfg)

    assert super_setup == [dict(mp_cfg=dict(opencv_num_threads=0))]
    assert env_cfg["cudnn_benchmark"] is True  # the caller's dict is not changed


def test_cudnn_benchmark_is_kept_on_cuda(monkeypatch, events, fake_dist, super_setup):
    install_cuda(monkeypatch, events=events)

    make_runner("none").setup_env(dict(cudnn_benchmark=True))

    assert super_setup == [dict(cudnn_benchmark=True)]


@pytest.fixture
def mmengine_setup(monkeypatch):
    """mmengine's setup_env runs for real, minus process-wide multiprocessing settings."""
    calls = mock.Mock()
    monkeypatch.setattr(mm_runner, "set_multi_processing", calls.set_multi_processing)
    monkeypatch.setattr(mm_runner, "init_dist", calls.init_dist)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    return calls


def test_mmengine_setup_runs_after_the_group(monkeypatch, events, fake_dist, mmengine_setup):
    install_v2(monkeypatch, events=events)
    os.environ["LOCAL_RANK"] = "3"
    broadcasts = []

    def get_dist_info():
        assert fake_dist.initialized, "mmengine read rank/world size before the group"
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

    assert events == [("set_device", 3), ("init_process_group", "cpu:gloo,gcu:eccl")]
    assert (runner.rank, runner.world_size) == (11, 16)
    assert re.fullmatch(r"\d{8}_\d{6}", runner.timestamp)
    assert [t.dtype for t in broadcasts] == [torch.float64]
    mmengine_setup.init_dist.assert_not_called()
    mmengine_setup.set_multi_processing.assert_called_once_with(
        mp_start_method="fork", opencv_num_threads=0, distributed=True
    )
    assert torch.backends.cudnn.benchmark is False


def test_mmengine_setup_single_process_on_cpu(monkeypatch, events, fake_dist, mmengine_setup):
    install_cpu(monkeypatch)
    runner = make_runner("none")

    runner.setup_env(dict(dist_cfg=dict(backend="nccl")))

    assert (runner.rank, runner.world_size, runner.card) == (0, 1, 0)
    assert re.fullmatch(r"\d{8}_\d{6}", runner.timestamp)
    assert not fake_dist.initialized
    mmengine_setup.init_dist.assert_not_called()


def test_env_cfg_device_chooses_the_backend(monkeypatch, events, fake_dist, super_setup):
    install_v2(monkeypatch, events=events)
    runner = make_runner("none")

    runner.setup_env(dict(device="cpu"))

    assert isinstance(runner.device_backend, CpuBackend)
    assert events == [("super",)]  # the v2 card was not touched


# -- _log_env ---------------------------------------------------------------------


def test_log_env_names_rank_card_and_generation(monkeypatch):
    monkeypatch.setattr(Runner, "_log_env", lambda self, env_cfg: None)
    backend = install_cpu(monkeypatch)
    runner = make_runner("none")
    runner.device_backend, runner.card = backend, 0
    runner._rank, runner._world_size = 0, 1
    runner.logger = mock.Mock()

    runner._log_env({})

    fmt, *args = runner.logger.info.call_args.args
    line = fmt % tuple(args)
    assert line.startswith("mmgcu: rank 0 of 1 on cpu (generation cpu: no torch_gcu")
    assert line.endswith("process group none")


# -- register_hooks ------------------------------------------------------------------


def placement_hooks(runner):
    return [h for h in runner._hooks if isinstance(h, GCUDevicePlacementHook)]


def hooked_runner(backend=None, **cfg):
    runner = make_runner("none", **cfg)
    runner._hooks = []
    runner.device_backend = backend or CpuBackend()  # setup_env has run before
    return runner


def test_register_hooks_adds_one_placement_hook():
    runner = hooked_runner()

    runner.register_hooks()

    assert len(placement_hooks(runner)) == 1
    assert len(runner._hooks) == 7  # mmengine's six default hooks are still there


@pytest.mark.parametrize(
    "listed", [dict(type="GCUDevicePlacementHook"), GCUDevicePlacementHook()], ids=["cfg", "obj"]
)
@pytest.mark.parametrize("generation", ["v2", "cpu"])
def test_register_hooks_keeps_a_listed_placement_hook(listed, generation, monkeypatch):
    runner = hooked_runner(INSTALL[generation](monkeypatch))

    runner.register_hooks(custom_hooks=[listed])

    assert len(placement_hooks(runner)) == 1


def test_register_hooks_without_placement_check():
    runner = hooked_runner(gcu_placement_check=False)

    runner.register_hooks()

    assert placement_hooks(runner) == []
    assert len(runner._hooks) == 6


# -- seeding ---------------------------------------------------------------------------


@pytest.mark.parametrize("diff_rank_seed", [False, True])
def test_set_randomness_seeds_the_cards(diff_rank_seed, monkeypatch):
    """torch_gcu 1.x is not reached by torch.manual_seed: the runner must seed the cards."""
    runner = make_runner()
    runner.device_backend = mock.Mock()
    monkeypatch.setattr("mmengine.runner.utils.get_rank", lambda: 3)
    runner.set_randomness(seed=7, diff_rank_seed=diff_rank_seed)
    expected = 7 + 3 if diff_rank_seed else 7
    assert runner._seed == expected
    runner.device_backend.manual_seed_all.assert_called_once_with(expected)


# -- a rank whose collective lost a peer ------------------------------------------------

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


def test_train_returns_mmengines_result(monkeypatch):
    runner = make_runner("pytorch")
    model = torch.nn.Linear(1, 1)
    monkeypatch.setattr(Runner, "train", lambda self: model)

    assert runner.train() is model
