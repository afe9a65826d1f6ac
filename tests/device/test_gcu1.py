"""GCU1Accelerator: torch_gcu 1.x, cards ``xla:N``, two process groups and the lazy step.

Most tests run over :class:`tests.fakes.FakeTorchGCU1` (every vendor call recorded); the
last runs the accelerator on the real simulated torch_gcu 1.x in a fresh process.
"""

import collections
import datetime
import os
from unittest import mock

import pytest
import torch

from mmgcu.device import GCUError, gcu1_dist
from mmgcu.device.gcu1 import ECCL_GROUP_NAME, JIT_MODES
from tests import fakes
from tests.conftest import free_port, last_json, run_program

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "accelerator_on_sim.py")


@pytest.fixture
def events():
    return []


@pytest.fixture
def accelerator(monkeypatch, events):
    return fakes.gcu1(monkeypatch, cards=8, current=0, events=events)


@pytest.fixture
def vendor(accelerator):
    return accelerator.torch_gcu


@pytest.fixture
def torch_dist(monkeypatch, events):
    """torch.distributed's group creation, recorded; the world has ``world[0]`` ranks."""
    world = [1]

    def init_process_group(backend=None, **kwargs):
        events.append(("init_process_group", backend, kwargs))

    def broadcast_object_list(objects, src=0, group=None):
        events.append(("broadcast_object_list", src))
        objects[:] = [29617]  # the free port rank 0 picked

    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: world[0])
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 3)
    monkeypatch.setattr(torch.distributed, "broadcast_object_list", broadcast_object_list)
    return world


@pytest.fixture
def rendezvous(monkeypatch):
    """The variables torchrun (without its agent store) sets for rank 3 of 4."""
    for name, value in dict(
        MASTER_ADDR="10.0.0.7", MASTER_PORT="29500", RANK="3", WORLD_SIZE="4"
    ).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)


def test_kind_attributes(accelerator):
    assert (accelerator.kind, accelerator.device_type, accelerator.is_gcu) == ("gcu1", "xla", True)
    assert accelerator.lazy is True
    assert (accelerator.cudnn, accelerator.torch_sync_bn) == (False, False)
    # mmengine's collectives send CPU tensors: the default group is gloo for them, and
    # routes card tensors to the ECCL world; a config may ask for plain gloo.
    assert accelerator.default_pg_backend == "gloo_eccl"
    assert accelerator.other_pg_backends == ("gloo",)
    assert accelerator.vendor_ddp() is accelerator.torch_gcu.nn.parallel.DistributedDataParallel
    assert accelerator.amp_dtypes == (torch.float16, torch.bfloat16)
    assert accelerator.card_group is None
    assert accelerator.description == "torch_gcu 2.5.136 (1.x, XLA 'xla')"


# -- cards ---------------------------------------------------------------------------------


def test_is_available_returns_a_bool(accelerator, vendor):
    vendor.is_available.return_value = 0
    assert accelerator.is_available() is False
    vendor.is_available.return_value = 1
    assert accelerator.is_available() is True


def test_device_count_and_current_device(accelerator, vendor):
    vendor.device_count.return_value = 4
    vendor.cards.current = 2
    assert accelerator.device_count() == 4
    assert accelerator.current_device() == 2


def test_set_device(accelerator, events):
    accelerator.set_device(5)
    assert events == [("set_device", 5)]


@pytest.mark.parametrize("index", [8, -1])
def test_set_device_refuses_a_missing_card_that_1x_would_ignore(accelerator, vendor, index):
    with pytest.raises(GCUError, match=f"card {index} does not exist: 8 card"):
        accelerator.set_device(index)
    vendor.set_device.assert_not_called()


def test_device_comes_from_gcu_device(accelerator, vendor):
    assert accelerator.device(3) == torch.device("xla", 3)
    vendor.gcu_device.assert_called_once_with(3)
    vendor.current_device.assert_not_called()


def test_device_defaults_to_the_current_card(accelerator, vendor):
    vendor.cards.current = 7
    assert accelerator.device() == torch.device("xla", 7)
    vendor.gcu_device.assert_called_once_with(7)


def test_device_name(accelerator, vendor):
    assert accelerator.device_name(1) == "T20"
    vendor.get_device_name.assert_called_once_with(1)


# -- memory and seeds ------------------------------------------------------------------------


def test_memory_is_the_hbm_allocated_now(accelerator, vendor):
    vendor.get_hbm_alloc_size.return_value = 2048
    assert accelerator.peak_memory(3) == 2048
    vendor.get_hbm_alloc_size.assert_called_once_with(3)
    assert "get_hbm_alloc_size" in accelerator.memory_source
    assert "no peak" in accelerator.memory_source


def test_there_is_no_cache_to_empty(accelerator, vendor):
    assert not hasattr(vendor, "empty_cache")
    assert accelerator.caches_memory is False
    assert accelerator.empty_cache() is False


@pytest.mark.parametrize("seed, given", [(42, 42), (2**32 + 5, 5)])
def test_manual_seed_all_fits_the_seed_in_32_bits(accelerator, vendor, seed, given):
    accelerator.manual_seed_all(seed)
    vendor.manual_seed_all.assert_called_once_with(given)


# -- process groups --------------------------------------------------------------------------


def test_check_collectives(accelerator, vendor):
    accelerator.check_collectives()
    vendor.distributed.is_eccl_available.return_value = False
    with pytest.raises(GCUError, match="ECCL is not available.*Install the ECCL package"):
        accelerator.check_collectives()


def test_init_process_groups_makes_a_gloo_world_and_an_eccl_world(
    accelerator, vendor, events, torch_dist, rendezvous
):
    torch_dist[0] = 4  # rank 3 of 4
    group = accelerator.init_process_groups("gloo")

    thirty_minutes = datetime.timedelta(minutes=30)
    assert events == [
        ("init_process_group", "gloo", dict(timeout=thirty_minutes)),
        ("broadcast_object_list", 0),  # rank 0's free port: MASTER_PORT is torch's
        ("eccl init_process_group", "eccl"),
    ]
    vendor.distributed.init_process_group.assert_called_once_with(
        "eccl",
        init_method="tcp://10.0.0.7:29617?rank=3&world_size=4",
        timeout=thirty_minutes,
        group_name=ECCL_GROUP_NAME,
    )
    assert group is accelerator.card_group
    assert group.dist is vendor.distributed
    assert group.group is vendor.distributed.group.WORLD is not None
    assert group.name == "torch_gcu.distributed eccl"


def test_gloo_eccl_sends_card_tensors_to_the_eccl_world(
    accelerator, vendor, events, torch_dist, rendezvous, monkeypatch
):
    monkeypatch.setattr(gcu1_dist, "register", lambda route: events.append(("register", route)))
    torch_dist[0] = 4
    group = accelerator.init_process_groups("gloo_eccl")

    assert [e[:2] for e in events] == [
        ("register", accelerator.routes),  # before the group that uses it
        ("init_process_group", "gloo_eccl"),
        ("broadcast_object_list", 0),
        ("eccl init_process_group", "eccl"),
    ]
    route = accelerator.routes
    assert (route.eccl, route.group) == (vendor.distributed, vendor.distributed.group.WORLD)
    assert group.group is route.group
    assert accelerator.summary()["process_groups"] == (
        "torch.distributed gloo_eccl + torch_gcu.distributed eccl"
    )
    # Before a routed group waits on the host it launches the graphs of its ECCL calls.
    tensor = torch.ones(1)
    route.issued([tensor])
    route.before_host_wait()
    vendor.unlazy.assert_called_once_with([tensor], mode=fakes.JitRunMode.ASYNC)


def test_plain_gloo_registers_nothing(accelerator, events, torch_dist, rendezvous, monkeypatch):
    monkeypatch.setattr(gcu1_dist, "register", lambda route: events.append(("register", route)))
    accelerator.init_process_groups("gloo")
    assert "register" not in [e[0] for e in events]
    assert accelerator.summary()["process_groups"] == (
        "torch.distributed gloo + torch_gcu.distributed eccl"
    )


def test_eccl_uses_torchruns_agent_store(accelerator, vendor, torch_dist, rendezvous, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    accelerator.init_process_groups("gloo")
    assert vendor.distributed.init_process_group.call_args.kwargs["init_method"] == "env://"


def test_timeout_and_options_reach_the_groups(accelerator, vendor, events, torch_dist, rendezvous):
    timeout = datetime.timedelta(seconds=90)
    accelerator.init_process_groups("gloo", timeout=timeout, init_method="env://")
    assert events[0] == ("init_process_group", "gloo", dict(timeout=timeout, init_method="env://"))
    assert vendor.distributed.init_process_group.call_args.kwargs["timeout"] == timeout


def test_group_name_is_not_torch_distributed_default():
    # Both worlds prefix their keys on torchrun's store alike; the names must differ.
    assert ECCL_GROUP_NAME not in ("", "0")


def test_a_failed_torch_group_is_a_gcu_error(accelerator, vendor, monkeypatch, rendezvous):
    failure = RuntimeError("connect() timed out")
    monkeypatch.setattr(torch.distributed, "init_process_group", mock.Mock(side_effect=failure))
    with pytest.raises(GCUError, match="torch.distributed gloo group failed: connect") as err:
        accelerator.init_process_groups("gloo")
    assert err.value.__cause__ is failure
    vendor.distributed.init_process_group.assert_not_called()


def test_a_failed_eccl_group_is_a_gcu_error(accelerator, vendor, torch_dist, rendezvous):
    vendor.distributed.init_process_group.side_effect = RuntimeError("only support eccl")
    with pytest.raises(GCUError, match=r"creating the ECCL group .*failed: only support eccl"):
        accelerator.init_process_groups("gloo")
    assert accelerator.card_group is None


@pytest.mark.parametrize("world, mode", [(1, "SAFEASYNC"), (4, "ASYNC")])
def test_jit_mode_follows_the_world_size(accelerator, vendor, torch_dist, rendezvous, world, mode):
    torch_dist[0] = world
    accelerator.init_process_groups("gloo")
    assert accelerator.summary()["jit_mode"] == mode
    model = torch.nn.Linear(1, 1)
    accelerator.optimizer_step(_optimizer(model), model)
    accelerator.finish_step()
    assert vendor.unlazy.call_args.kwargs["mode"] is getattr(fakes.JitRunMode, mode)


def test_a_configured_jit_mode_is_kept(monkeypatch, torch_dist, rendezvous):
    accelerator = fakes.gcu1(monkeypatch, jit_mode="SYNC")
    torch_dist[0] = 8
    accelerator.init_process_groups("gloo")
    assert accelerator.summary()["jit_mode"] == "SYNC"


def test_jit_modes():
    assert JIT_MODES == ("SYNC", "ASYNC", "SAFEASYNC")


def test_adopt_needs_the_eccl_world(accelerator):
    with pytest.raises(GCUError) as err:
        accelerator.adopt_process_groups()
    message = str(err.value)
    assert "torch_gcu.distributed was not" in message
    assert "init_process_group('eccl', group_name='mmgcu_eccl')" in message


def test_adopt_takes_an_existing_eccl_world(accelerator, vendor):
    vendor.distributed.group.WORLD = world = object()
    group = accelerator.adopt_process_groups()
    assert group is accelerator.card_group
    assert (group.dist, group.group) == (vendor.distributed, world)


def test_ddp_kwargs_name_one_card_and_the_eccl_group(accelerator, vendor, torch_dist, rendezvous):
    accelerator.init_process_groups("gloo")
    # device_ids=None would make the vendor DDP replicate the model onto every card.
    assert accelerator.ddp_kwargs(3) == dict(
        device_ids=[3], process_group=vendor.distributed.group.WORLD
    )
    assert accelerator.vendor_ddp() is fakes.FakeGCU1DDP


# -- precision -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_is_the_vendor_autocast(accelerator, vendor, dtype):
    context = accelerator.autocast(dtype, enabled=False)
    assert isinstance(context, fakes.FakeAutocast)
    vendor.amp.autocast.assert_called_once_with(enabled=False, dtype=dtype)


def test_autocast_refuses_other_dtypes(accelerator, vendor):
    with pytest.raises(GCUError, match="supports float16 and bfloat16, not torch.float32"):
        accelerator.autocast(torch.float32)
    vendor.amp.autocast.assert_not_called()


def test_grad_scaler_avoids_the_host_barrier(accelerator, vendor):
    scaler = accelerator.grad_scaler(init_scale=4.0)
    vendor.amp.GradScaler.assert_called_once_with(use_zero_grad=True, init_scale=4.0)
    assert scaler.use_zero_grad is True


# -- the step --------------------------------------------------------------------------------


def _optimizer(model):
    """A stand-in optimizer of ``model``'s parameters, with no state."""
    return mock.Mock(
        param_groups=[dict(params=list(model.parameters()))], state=collections.defaultdict(dict)
    )


def _card(*shape):
    """A stand-in the accelerator takes for a card tensor (a tensor on an ``xla`` device)."""
    return mock.NonCallableMock(spec=torch.Tensor, device=torch.device("xla", 0), shape=shape)


def test_optimizer_step_steps_now_and_runs_the_graph_at_the_end_of_the_iteration(
    accelerator, vendor, events
):
    """The 1.x step split as its AMP path is: optimizer.step() at once (the vendor's
    optimizer_step would step it too), the graph of the step's outputs (optimizer_step's
    with model=: the parameters, the optimizer state, the buffers, the loss) with what the
    log reads of the iteration, at finish_step."""
    model = torch.nn.BatchNorm1d(2)
    optimizer = _optimizer(model)
    loss, logged = _card(), _card(3)

    accelerator.optimizer_step(optimizer, model, loss, closure=None)
    optimizer.step.assert_called_once_with(closure=None)
    assert vendor.unlazy.call_count == 0 and vendor.optimizer_step.call_count == 0

    accelerator.finish_step([logged])
    (outputs,), kwargs = vendor.unlazy.call_args
    params, buffers = list(model.parameters()), list(model.buffers())
    assert len(outputs) == len(params) + len(buffers) + 2
    stored = [t.data_ptr() for t in outputs[:-2]]
    assert stored == [t.data_ptr() for t in params + buffers]
    assert outputs[-2:] == [loss, logged]
    assert kwargs == dict(mode=fakes.JitRunMode.SAFEASYNC)
    accelerator.finish_step([logged])  # nothing left to run
    assert vendor.unlazy.call_count == 1


def test_a_step_no_hook_finished_runs_before_the_next(accelerator, vendor):
    model = torch.nn.Linear(1, 1)
    optimizer = _optimizer(model)
    accelerator.optimizer_step(optimizer, model)
    accelerator.optimizer_step(optimizer, model)
    assert vendor.unlazy.call_count == 1 and optimizer.step.call_count == 2


def test_an_iteration_without_a_step_leaves_its_values_to_the_next_steps_graph(accelerator, vendor):
    """Gradient accumulation: no optimizer step, so no graph run; what the iteration logged
    is output by the next step's one run."""
    vendor.sync_lived_tensor = mock.Mock()
    model = torch.nn.Linear(1, 1)
    optimizer = _optimizer(model)
    first, second = _card(), _card()
    accelerator.finish_step([first])
    assert vendor.unlazy.call_count == 0 and vendor.sync_lived_tensor.call_count == 0
    accelerator.optimizer_step(optimizer, model)
    accelerator.finish_step([second])
    outputs = vendor.unlazy.call_args.args[0]
    assert vendor.unlazy.call_count == 1 and outputs[-2:] == [first, second]
    accelerator.optimizer_step(optimizer, model)
    accelerator.finish_step()
    assert all(output is not first for output in vendor.unlazy.call_args.args[0])  # once only


def test_optimizer_step_without_model_names_the_card(accelerator, vendor):
    vendor.cards.current = 6
    accelerator.optimizer_step(mock.Mock())
    kwargs = vendor.optimizer_step.call_args.kwargs
    assert (kwargs.get("model"), kwargs["device"]) == (None, 6)


def test_after_amp_step_runs_the_graph_of_the_amp_outputs(accelerator, vendor, events):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler, loss, collected = object(), _card(), [_card(2), _card()]
    vendor.collect_amp_training_params.side_effect = lambda *args: collected

    accelerator.after_amp_step(optimizer, model, scaler, loss)
    accelerator.finish_step()

    vendor.collect_amp_training_params.assert_called_once_with(model, optimizer, scaler)
    (outputs,), kwargs = vendor.unlazy.call_args
    assert outputs == collected + [loss]
    assert kwargs == dict(mode=fakes.JitRunMode.SAFEASYNC)
    assert events == [("unlazy", fakes.JitRunMode.SAFEASYNC)]


def test_after_amp_step_leaves_out_what_is_not_on_the_card(accelerator, vendor):
    """torch 2's Adam keeps its step count in a CPU tensor, which unlazy would refuse."""
    model = torch.nn.Linear(2, 1)
    accelerator.after_amp_step(torch.optim.SGD(model.parameters(), lr=0.1), model, None, None)
    accelerator.finish_step()
    (outputs,), _ = vendor.unlazy.call_args
    assert outputs == []


def test_compiled_graphs_reads_the_metrics_report(accelerator, vendor):
    vendor.metrics_report = mock.Mock(
        return_value="Metric: CompileTime\n  TotalSamples: 7\nCounter: CachedCompile\n"
        "  Value: 40\nCounter: UncachedCompile\n  Value: 7\n"
    )
    assert accelerator.compiled_graphs() == 7


@pytest.mark.parametrize(
    "report", ["", "Compiles: 7", RuntimeError("no metrics")], ids=["empty", "other", "raises"]
)
def test_compiled_graphs_is_none_where_the_report_says_nothing_it_knows(
    accelerator, vendor, report
):
    vendor.metrics_report = mock.Mock(
        side_effect=report if isinstance(report, Exception) else None,
        return_value=None if isinstance(report, Exception) else report,
    )
    assert accelerator.compiled_graphs() is None


def test_summary(accelerator):
    assert accelerator.summary() == {
        "kind": "gcu1",
        "device_type": "xla",
        "description": "torch_gcu 2.5.136 (1.x, XLA 'xla')",
        "available": True,
        "cards": 8,
        "process_groups": "torch.distributed gloo_eccl + torch_gcu.distributed eccl",
        "memory": accelerator.memory_source,
        "jit_mode": "ASYNC with several ranks, else SAFEASYNC",
    }


# -- on the simulated torch_gcu 1.x ------------------------------------------------------------


def test_on_the_simulated_torch_gcu_1x():
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
    assert (out["kind"], out["cards"], out["current"], out["device"]) == ("gcu1", 2, 1, "xla:1")
    assert out["missing_card"] == "GCUError: card 2 does not exist: 2 card(s) visible"
    assert out["memory"] == [256 * 1024, 0, 0]  # allocated at each reading
    assert out["empty_cache"] is False
    assert out["group"] == ["torch_gcu.distributed eccl", 1, True]
    assert out["reduced"] == ["xla:1", [2.0, 2.0, 2.0]]
    assert out["summary"]["jit_mode"] == "SAFEASYNC"  # one rank
    # One graph run per step: unlazy of the model's outputs (not every live tensor), at the
    # end of the iteration; the simulated card ran one graph and compiled it.
    assert out["step"] == {"unlazy": 1, "graph_mode_SAFEASYNC": 1, "graph_outputs_all_live": 0}
    assert out["step_graphs"] == {"runs.step": 1, "UncachedCompile": 1, "events": 1}
    assert out["stepped"] is True
    assert out["amp_dtype"] == "torch.float16"
    # AMP: the scaler steps; then one unlazy of the AMP outputs.
    assert out["amp_step"] == {"unlazy": 1, "graph_mode_SAFEASYNC": 1, "graph_outputs_all_live": 0}
    assert out["amp_graphs"]["runs.step"] == 1
    assert out["amp_stepped"] is True


def test_each_step_ends_with_a_new_seed_as_a_step_marker_makes_one(accelerator, vendor):
    """A random op's seed chains on the last one's until a step marker or a new seed, and
    1.x's step syncs listed tensors (no marker): without a new seed a model with dropout
    would compile a longer graph every step. The seeds follow torch_xla's marker."""
    model = torch.nn.Linear(1, 1)
    accelerator.manual_seed_all(7)
    seeds = [7]
    for _ in range(2):
        accelerator.optimizer_step(_optimizer(model), model)
        accelerator.finish_step()
        seeds.append((1012031 + 7012063 * seeds[-1]) % 2**32)
    assert [c.args[0] for c in vendor.manual_seed_all.call_args_list] == seeds
    accelerator.finish_step()  # nothing ran: no new seed
    assert vendor.manual_seed_all.call_count == 3
