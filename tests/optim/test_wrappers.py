"""GCUOptimWrapper and GCUAmpOptimWrapper: bound to an accelerator, they step on its card.

In-process the accelerator is a real GCU1Accelerator over the fake torch_gcu 1.x (its
``device()`` is the CPU), whose calls are recorded in order in ``events``; the last test
runs both wrappers on the simulated torch_gcu 1.x in a fresh process.
"""

import copy
import inspect
import os
from unittest import mock

import pytest
import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

from mmgcu.binding import Binding
from mmgcu.device import GCUError
from mmgcu.optim import GCUAmpOptimWrapper, GCUOptimWrapper
from tests import fakes
from tests.conftest import last_json, run_log, run_program
from tests.fakes import ToyModel, toy_batch

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "wrappers_on_sim.py")


@pytest.fixture
def events():
    return []


@pytest.fixture
def gcu1(monkeypatch, events):
    return fakes.gcu1(monkeypatch, events=events, on_cpu=True)


@pytest.fixture
def model():
    torch.manual_seed(0)
    return ToyModel()


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def loss_of(model, scale=1.0):
    return model(**toy_batch(), mode="loss")["loss"] * scale


def spy_step(monkeypatch, accelerator):
    """The accelerator's optimizer_step, recorded and still run."""
    spy = mock.Mock(wraps=accelerator.optimizer_step)
    monkeypatch.setattr(accelerator, "optimizer_step", spy)
    return spy


def test_both_are_registered():
    assert OPTIM_WRAPPERS.get("GCUOptimWrapper") is GCUOptimWrapper
    assert OPTIM_WRAPPERS.get("GCUAmpOptimWrapper") is GCUAmpOptimWrapper


# -- bind ------------------------------------------------------------------------------------------


def test_binding_names_accelerator_and_model(gcu1, model):
    wrapper = GCUOptimWrapper(optimizer=sgd(model))
    assert (wrapper.accelerator, wrapper.model) == (None, None)
    wrapper.bind(Binding(gcu1, model))
    assert (wrapper.accelerator, wrapper.model) == (gcu1, model)


@pytest.mark.usefixtures("fresh_notes")
def test_an_unbound_wrapper_steps_as_mmengines(model):
    """Built by another runner (no bind), GCUOptimWrapper is OptimWrapper."""
    twin = copy.deepcopy(model)
    wrapper = GCUOptimWrapper(optimizer=sgd(model), clip_grad=dict(max_norm=0.1))
    stock = OptimWrapper(optimizer=sgd(twin), clip_grad=dict(max_norm=0.1))

    for _ in range(2):
        wrapper.update_params(loss_of(model))
        stock.update_params(loss_of(twin))

    for mine, theirs in zip(model.parameters(), twin.parameters()):
        assert torch.equal(mine, theirs)


@pytest.mark.usefixtures("fresh_notes")
def test_an_unbound_amp_wrapper_off_cuda_says_what_mmengines_needs(model):
    """Unbound, GCUAmpOptimWrapper is AmpOptimWrapper, which needs CUDA."""
    with pytest.raises(GCUError) as err:
        with GCUAmpOptimWrapper(optimizer=sgd(model)).optim_context(model):
            pass
    message = str(err.value)
    assert message.startswith("GCUAmpOptimWrapper was not built by GCURunner, so it has no card")
    assert "AmpOptimWrapper" in message and "needs CUDA" in message
    assert "runner_type='GCURunner'" in message


@pytest.mark.usefixtures("fresh_notes")
def test_unbound_on_cuda_the_amp_wrapper_is_mmengines(monkeypatch, model):
    """With CUDA, unbound, it autocasts and scales as AmpOptimWrapper: on CUDA."""
    cuda = fakes.cuda(monkeypatch)
    monkeypatch.setattr("mmgcu.optim.wrappers.CUDAAccelerator", lambda: cuda)
    wrapper = GCUAmpOptimWrapper(optimizer=sgd(model))

    state = wrapper.state_dict()

    assert wrapper.accelerator is cuda and "loss_scaler" in state


@pytest.mark.usefixtures("fresh_notes")
def test_under_a_plain_runner_gcu_optim_wrapper_trains(runner_case):
    cfg = copy.deepcopy(runner_case.iter_based_cfg)
    cfg.train_cfg = dict(by_epoch=False, max_iters=3)
    cfg.optim_wrapper = dict(type="GCUOptimWrapper", optimizer=dict(type="SGD", lr=0.1))
    runner = runner_case.build_runner(cfg)
    before = [p.detach().clone() for p in runner.model.parameters()]

    runner.train()

    assert type(runner.optim_wrapper) is GCUOptimWrapper
    assert runner.optim_wrapper.accelerator is None
    assert any(not torch.equal(a, b) for a, b in zip(before, runner.model.parameters()))
    assert "GCUOptimWrapper acts as mmengine's optimizer wrapper" in run_log(runner)


# -- the step ------------------------------------------------------------------------------------


def test_the_step_is_the_accelerators_once_per_accumulated_step(monkeypatch, gcu1, model, events):
    step = spy_step(monkeypatch, gcu1)
    wrapper = GCUOptimWrapper(optimizer=sgd(model), accumulative_counts=2)
    wrapper.bind(Binding(gcu1, model))

    for scale in (1.0, 2.0, 3.0, 4.0):
        wrapper.update_params(loss_of(model, scale))
        gcu1.finish_step()  # as GCURuntimeInfoHook ends each iteration

    assert step.call_count == 2
    for call in step.call_args_list:
        optimizer, stepped_model, loss = call.args
        assert optimizer is wrapper.optimizer and stepped_model is model
        assert loss.shape == () and not loss.requires_grad
    # On torch_gcu 1.x each step's graph runs when its iteration ends: an unlazy of the
    # model's parameters (and its other outputs).
    assert events == [("unlazy", fakes.JitRunMode.SAFEASYNC)] * 2
    (outputs,), _ = gcu1.torch_gcu.unlazy.call_args
    params = [p.data_ptr() for p in model.parameters()]
    assert [t.data_ptr() for t in outputs[: len(params)]] == params


@pytest.mark.parametrize("accumulative_counts", [1, 2])
def test_the_step_gets_the_loss_update_params_got(monkeypatch, gcu1, model, accumulative_counts):
    step = spy_step(monkeypatch, gcu1)
    wrapper = GCUOptimWrapper(optimizer=sgd(model), accumulative_counts=accumulative_counts)
    wrapper.bind(Binding(gcu1, model))
    losses = [loss_of(model, scale) for scale in (1.0, 2.0)]

    for loss in losses:
        wrapper.update_params(loss)

    given = step.call_args.args[2]
    assert torch.equal(given, losses[-1])
    assert given.data_ptr() == losses[-1].data_ptr()  # the loss itself, detached


def test_the_step_updates_the_parameters_once_per_step(monkeypatch, model):
    wrapper = GCUOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    wrapper.bind(Binding(fakes.cpu(), model))
    reference = ToyModel()
    reference.load_state_dict(model.state_dict())
    plain = OptimWrapper(optimizer=torch.optim.SGD(reference.parameters(), lr=0.1))

    for _ in range(3):
        wrapper.update_params(loss_of(model))
        plain.update_params(loss_of(reference))

    assert torch.equal(model.linear.weight, reference.linear.weight)


def test_step_arguments_reach_the_optimizer(monkeypatch, gcu1, model):
    step = spy_step(monkeypatch, gcu1)
    wrapper = GCUOptimWrapper(optimizer=sgd(model))
    wrapper.bind(Binding(gcu1, model))

    wrapper.update_params(loss_of(model), step_kwargs=dict(closure=None))

    assert step.call_args.kwargs == dict(closure=None)


def test_gradients_are_clipped_before_the_step(monkeypatch, gcu1, model):
    norms = []

    def record(optimizer, *args, **kwargs):
        grads = [p.grad for p in model.parameters()]
        norms.append(torch.norm(torch.stack([g.norm() for g in grads])).item())

    monkeypatch.setattr(gcu1, "optimizer_step", record)
    wrapper = GCUOptimWrapper(optimizer=sgd(model), clip_grad=dict(max_norm=0.01))
    wrapper.bind(Binding(gcu1, model))

    wrapper.update_params(loss_of(model, 100.0))

    assert norms and norms[0] <= 0.01 + 1e-6


# -- AMP -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "loss_scale, scaler_args",
    [("dynamic", {}), (512.0, dict(init_scale=512.0)), (dict(growth_interval=10), {})],
)
def test_the_scaler_comes_from_the_accelerator_at_bind(gcu1, model, loss_scale, scaler_args):
    wrapper = GCUAmpOptimWrapper(optimizer=sgd(model), loss_scale=loss_scale)
    assert wrapper.loss_scaler is None  # no CUDA GradScaler is made

    wrapper.bind(Binding(gcu1, model))

    expected = dict(scaler_args, **(loss_scale if isinstance(loss_scale, dict) else {}))
    gcu1.torch_gcu.amp.GradScaler.assert_called_once_with(use_zero_grad=True, **expected)
    assert isinstance(wrapper.loss_scaler, fakes.FakeGradScaler)


def test_the_overflow_step_is_the_accelerators_to_offer(gcu1, model):
    zero = GCUAmpOptimWrapper(optimizer=sgd(model), overflow_step="zero")
    zero.bind(Binding(gcu1, model))
    gcu1.torch_gcu.amp.GradScaler.assert_called_once_with(use_zero_grad=True)
    skip = GCUAmpOptimWrapper(optimizer=sgd(model), overflow_step="skip")
    with pytest.raises(GCUError, match=r"overflow_step='skip' is not available on gcu1"):
        skip.bind(Binding(gcu1, model))


def test_binding_again_keeps_the_scaler(gcu1, model):
    wrapper = GCUAmpOptimWrapper(optimizer=sgd(model))
    wrapper.bind(Binding(gcu1, model))
    scaler = wrapper.loss_scaler
    wrapper.bind(Binding(gcu1, model))  # GCURunner binds again when it resumes
    assert wrapper.loss_scaler is scaler


def test_a_bad_loss_scale_is_refused(model):
    with pytest.raises(TypeError, match='loss_scale must be of type float, dict, or "dynamic"'):
        GCUAmpOptimWrapper(optimizer=sgd(model), loss_scale=512)


def test_fsdp_is_refused(model):
    with pytest.raises(GCUError, match="does not support use_fsdp=True"):
        GCUAmpOptimWrapper(optimizer=sgd(model), use_fsdp=True)


@pytest.mark.parametrize(
    "dtype, expected",
    [(None, torch.float16), ("float16", torch.float16), ("bfloat16", torch.bfloat16)]
    + [(torch.bfloat16, torch.bfloat16)],
)
def test_dtypes(gcu1, model, dtype, expected):
    wrapper = GCUAmpOptimWrapper(optimizer=sgd(model), dtype=dtype)
    wrapper.bind(Binding(gcu1, model))
    assert wrapper.cast_dtype == expected


def test_an_unknown_dtype_name_is_refused(model):
    with pytest.raises(GCUError, match=r"optim_wrapper.dtype='int8': use one of \("):
        GCUAmpOptimWrapper(optimizer=sgd(model), dtype="int8")


def test_a_dtype_the_card_cannot_autocast_is_refused_at_bind(gcu1, model):
    wrapper = GCUAmpOptimWrapper(optimizer=sgd(model), dtype="float32")
    with pytest.raises(GCUError) as err:
        wrapper.bind(Binding(gcu1, model))
    message = str(err.value)
    assert message.startswith("mixed precision with torch.float32 is not supported on gcu1 (")
    assert "supported: (torch.float16, torch.bfloat16)" in message
    assert wrapper.loss_scaler is None and wrapper.accelerator is None


def test_no_mixed_precision_on_the_cpu(model):
    wrapper = GCUAmpOptimWrapper(optimizer=sgd(model))
    with pytest.raises(GCUError, match="not supported on cpu .*supported: none"):
        wrapper.bind(Binding(fakes.cpu(), model))


def test_amp_step_then_the_accelerators_after_amp_step(monkeypatch, gcu1, model, events):
    after = mock.Mock(wraps=gcu1.after_amp_step)
    monkeypatch.setattr(gcu1, "after_amp_step", after)
    wrapper = GCUAmpOptimWrapper(optimizer=sgd(model), loss_scale=512.0)
    wrapper.bind(Binding(gcu1, model))
    loss = loss_of(model)

    wrapper.update_params(loss)
    gcu1.finish_step()

    assert events == [
        ("scaler.unscale_",),
        ("scaler.step",),
        ("scaler.update", 512.0),  # a static scale stays
        ("unlazy", fakes.JitRunMode.SAFEASYNC),
    ]
    optimizer, stepped_model, scaler, given = after.call_args.args
    assert (optimizer, stepped_model, scaler) == (wrapper.optimizer, model, wrapper.loss_scaler)
    assert torch.equal(given, loss) and not given.requires_grad  # not multiplied by the scale
    gcu1.torch_gcu.optimizer_step.assert_not_called()  # the scaler stepped


def test_amp_gradients_are_unscaled_before_clipping(monkeypatch, gcu1, model, events):
    wrapper = GCUAmpOptimWrapper(optimizer=sgd(model), clip_grad=dict(max_norm=1.0))
    wrapper.bind(Binding(gcu1, model))
    wrapper.update_params(loss_of(model))
    assert events[:2] == [("scaler.unscale_",), ("scaler.step",)]


def test_amp_steps_once_per_accumulated_step(gcu1, model, events):
    wrapper = GCUAmpOptimWrapper(optimizer=sgd(model), accumulative_counts=3)
    wrapper.bind(Binding(gcu1, model))
    for _ in range(6):
        wrapper.update_params(loss_of(model))
        gcu1.finish_step()
    assert [e[0] for e in events].count("unlazy") == 2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_optim_context_autocasts_on_the_card(gcu1, model, events, dtype):
    wrapper = GCUAmpOptimWrapper(optimizer=sgd(model), dtype=dtype)
    wrapper.bind(Binding(gcu1, model))

    with wrapper.optim_context(model):
        inside = list(events)

    assert inside == [("autocast", getattr(torch, dtype), True)]
    assert events[-1] == ("autocast exit",)
    gcu1.torch_gcu.amp.autocast.assert_called_once_with(enabled=True, dtype=getattr(torch, dtype))


def test_optim_context_keeps_mmengines_no_sync(gcu1, model):
    ddp = fakes.FakeGCU1DDP(model)
    wrapper = GCUAmpOptimWrapper(optimizer=sgd(model), accumulative_counts=2)
    wrapper.bind(Binding(gcu1, ddp))
    seen = []
    for _ in range(2):
        with wrapper.optim_context(ddp):
            seen.append(ddp.grad_sync)
        wrapper.update_params(loss_of(model))
    assert seen == [False, True]


# -- state dicts ----------------------------------------------------------------------------------


@pytest.mark.parametrize("wrapper_class", [GCUOptimWrapper, GCUAmpOptimWrapper])
def test_state_dict_round_trip(gcu1, model, wrapper_class):
    kwargs = dict(loss_scale=256.0) if wrapper_class is GCUAmpOptimWrapper else {}
    wrapper = wrapper_class(optimizer=sgd(model), **kwargs)
    wrapper.bind(Binding(gcu1, model))
    for _ in range(2):
        wrapper.update_params(loss_of(model))
    saved = wrapper.state_dict()

    fresh = wrapper_class(optimizer=sgd(model))
    fresh.bind(Binding(gcu1, model))
    fresh.load_state_dict(dict(saved))

    reloaded = fresh.state_dict()
    assert sorted(reloaded) == sorted(saved)
    for a, b in zip(saved["state"].values(), reloaded["state"].values()):
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
    if wrapper_class is GCUAmpOptimWrapper:
        assert saved["loss_scaler"] == reloaded["loss_scaler"] == {"scale": 256.0}


# -- the arguments of the upstream __init__ GCUAmpOptimWrapper mirrors ---------------------


def test_the_mirrored_arguments_match_upstream():
    """Upstream's arguments, in order, with overflow_step (mmgcu's) before **kwargs."""
    upstream = dict(inspect.signature(AmpOptimWrapper.__init__).parameters)
    mirrored = dict(inspect.signature(GCUAmpOptimWrapper.__init__).parameters)
    assert mirrored.pop("overflow_step").default is None
    assert list(mirrored) == list(upstream)
    assert [p.default for p in mirrored.values()] == [p.default for p in upstream.values()]


# -- on the simulated torch_gcu 1.x ---------------------------------------------------------------


def test_both_wrappers_on_the_simulated_torch_gcu_1x():
    out = last_json(run_program(PROGRAM, MMGCU_SIMULATE=2, MMGCU_SIMULATE_API="gcu1").stdout)

    plain, amp = out["plain"], out["amp"]
    # Four updates, accumulated by two: two lazy steps with the model's outputs and the loss,
    # each graph run when its iteration ends; the iterations that only accumulate end with
    # nothing the host reads, so no graph. One graph per step, no other.
    steps = {"unlazy": 2, "graph_mode_SAFEASYNC": 2, "graph_outputs_all_live": 0}
    one_graph_each = {"runs.step": 2, "runs.host_read": 0, "runs.fallback": 0}
    assert plain["counters"] == steps and plain["graph_runs"] == one_graph_each
    assert plain["moved"] and plain["forward_dtypes"] == ["torch.float32"]
    assert plain["round_trip"]["keys"] == ["param_groups", "state"]
    assert plain["round_trip"]["same_state"] is True
    # AMP: the vendor scaler steps, then one unlazy of the AMP outputs per step.
    assert amp["counters"] == steps and amp["graph_runs"] == one_graph_each
    assert amp["scaler"] == "mmgcu.sim.torch_gcu1.amp.grad_scaler.GradScaler"
    assert amp["moved"] and amp["forward_dtypes"] == ["torch.float16"]
    assert amp["round_trip"]["keys"] == ["loss_scaler", "param_groups", "state"]
    saved, reloaded = amp["round_trip"]["scaler"]
    assert saved == reloaded and saved["scale"] == 512.0
