"""What an overflowed AMP step does on each simulated generation: torch's skipped step (a card
read per step) or the zero step (``ZeroStepGradScaler`` on 2.x, torch_gcu 1.x's own
``use_zero_grad``: no read), and that the torch method the zero step overrides is still the
one torch calls."""

import inspect
import os

import pytest
import torch

from tests.conftest import SIM_APIS, TORCH_1, last_json, one_worker, run_program

# The module-scoped runs are made once: the module runs on one xdist worker.
pytestmark = one_worker(__name__)

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "overflow_step.py")


@pytest.fixture(scope="module", params=SIM_APIS)
def run(request):
    out = last_json(run_program(PROGRAM, MMGCU_SIMULATE=1, MMGCU_SIMULATE_API=request.param).stdout)
    return request.param, out


def test_each_generation_offers_its_modes_and_refuses_the_others(run):
    api, out = run
    modes = {"gcu2": ["skip", "zero"], "gcu1": ["zero"]}[api]
    assert list(out["modes"]) == modes
    refused = "'skip'" if api == "gcu1" else "'bogus'"
    assert f"overflow_step={refused} is not available on {api}" in out["refused"]
    assert f"use one of {modes}" in out["refused"]


def test_the_skip_step_reads_the_card_and_leaves_the_weights(run):
    api, out = run
    if api == "gcu1":
        pytest.skip("torch_gcu 1.x has no skipping GradScaler that works")
    skip = out["modes"]["skip"]
    assert skip["scaler"] == "GradScaler"
    assert skip["finite"]["reads"] == 1 and skip["overflowed"]["reads"] == 1  # found_inf.item()
    assert skip["overflowed"]["weight"] == skip["finite"]["weight"]
    assert skip["overflowed"]["momentum"] == skip["finite"]["momentum"]
    assert skip["scales"] == [1024.0, 512.0]


def test_the_zero_step_reads_nothing_and_steps_with_zero_gradients(run):
    api, out = run
    zero = out["modes"]["zero"]
    assert zero["finite"]["reads"] == 0 and zero["overflowed"]["reads"] == 0
    # SGD with momentum 0.9 on a zero gradient: buf <- 0.9 buf, w <- w - lr * buf.
    momentum = [0.9 * m for m in zero["finite"]["momentum"]]
    assert zero["overflowed"]["momentum"] == pytest.approx(momentum, rel=1e-6)
    moved = [w - 0.1 * m for w, m in zip(zero["finite"]["weight"], momentum)]
    assert zero["overflowed"]["weight"] == pytest.approx(moved, rel=1e-5, abs=1e-7)
    assert zero["scales"] == [1024.0, 512.0]  # the scale backs off as torch's does
    if api == "gcu2":
        assert zero["scaler"] == "ZeroStepGradScaler"
        skip = out["modes"]["skip"]  # a finite step is torch's step
        assert zero["finite"]["weight"] == skip["finite"]["weight"]


@pytest.mark.skipif(TORCH_1, reason="torch.amp.GradScaler: torch >= 2.3")
def test_torch_still_calls_the_method_the_zero_step_overrides():
    from torch.amp.grad_scaler import GradScaler

    from mmgcu.device.gcu2_amp import ZeroStepGradScaler

    params = list(inspect.signature(GradScaler._maybe_opt_step).parameters)
    assert params == ["self", "optimizer", "optimizer_state", "args", "kwargs"]
    assert "self._maybe_opt_step(optimizer, optimizer_state" in inspect.getsource(GradScaler.step)
    assert ZeroStepGradScaler._maybe_opt_step is not GradScaler._maybe_opt_step
    assert issubclass(ZeroStepGradScaler, torch.amp.GradScaler)
