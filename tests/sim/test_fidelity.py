"""The simulated cards behave like devices: placement, training, memory counters, checkpoints."""

import pytest

from tests.conftest import SIM_APIS, TORCH_1, last_json, needs_torch2
from tests.sim.helpers import DEVICE_TYPE, program, run_program, run_sim, sim_json


@pytest.mark.parametrize("api", SIM_APIS)
def test_a_module_trains_on_card_3(api):
    out = sim_json("train_step", api=api, cards=8)
    card = f"{DEVICE_TYPE[api]}:3"
    assert out["api"] == api and out["simulated"] is True
    assert out["device_count"] == 8
    if api == "gcu2":
        assert out["same_module"] is True
    else:
        assert out["gcu_device_3"] is True
    assert out["loss_device"] == card
    assert out["param_devices"] == [card]
    assert out["grad_devices"] == [card]
    assert out["buffer_devices"] == [card]
    assert out["n_state"] == 6 and out["state_devices"] == [card]
    # The same step as on the CPU: identical loss, parameters and BatchNorm statistics.
    assert out["loss_diff"] < 1e-6
    assert out["max_diff"] < 1e-6
    assert out["moved"] > 0  # the step changed the weights
    assert out["num_batches_tracked"] == 1
    expected = "Expected all tensors to be on the same device"
    assert out["cpu_input"] is not None and expected in out["cpu_input"]
    assert "cpu" in out["cpu_input"] and card in out["cpu_input"]
    assert out["other_card_input"] is not None and expected in out["other_card_input"]
    assert f"{DEVICE_TYPE[api]}:1" in out["other_card_input"]
    assert out["cuda_available"] is False


@pytest.mark.parametrize("api", SIM_APIS)
def test_memory_counters_are_true(api):
    out = sim_json("memory_counters", api=api, cards=8)
    zeros = [0] * 7
    for name, snap in out.items():
        if isinstance(snap, dict):
            assert snap["others"] == zeros, name
            assert snap["other_peaks"] == zeros, name
    assert out["start"]["now"] == 0 and out["start"]["peak"] == 0
    assert out["alloc"]["now"] == 4096 and out["alloc"]["peak"] == 4096
    assert out["views"]["now"] == 4096  # views share the storage: counted once
    assert out["result"]["now"] == 8192 and out["result"]["peak"] == 8192
    assert out["moved"]["now"] == 8192 + 2048  # 1024 float16 copied onto the card
    assert out["del_result"]["now"] == 4096
    assert out["del_views"]["now"] == 4096  # x itself is still alive
    assert out["del_all"]["now"] == 0
    assert out["del_all"]["peak"] == 8192 + 2048  # the peak stays until reset
    assert out["reset"] == {"now": 0, "peak": 0, "others": zeros, "other_peaks": zeros}
    assert out["card5"] == 1024 and out["by_device_arg"] == 1024
    assert out["card3_with_card5"] == 0
    assert out["card5_after"] == 0


def load_without_simulator(path):
    return last_json(run_program(program("load_plain"), path).stdout)


@pytest.mark.parametrize("api", SIM_APIS)
def test_a_checkpoint_of_card_tensors_loads_without_the_simulator(api, tmp_path):
    if api == "gcu1" and TORCH_1:
        pytest.skip(
            "torch 1.10 pickles an xla tensor through numpy with its card's name, which plain "
            "torch cannot rebuild (test_torch_gcu1.py checks it; mmgcu saves CPU tensors)"
        )
    path = tmp_path / "ckpt.pth"
    saved = sim_json("save_on_card", path, api=api, cards=4)
    assert saved["devices"] == [f"{DEVICE_TYPE[api]}:2"] * 3
    assert saved["is_param"] is True

    loaded = load_without_simulator(path)

    assert loaded["error"] is None
    assert loaded["plain"] == [True, True, True], loaded["types"]
    assert loaded["types"][1] == "Parameter"
    assert loaded["devices"] == ["cpu"] * 3
    assert loaded["tensor"] and loaded["param"] and loaded["buf"]
    assert loaded["param_requires_grad"] is True
    assert loaded["momentum"] == 0.9
    assert loaded["safe"] is True  # weights_only loading needs no simulator class either
    assert loaded["leaked"] == []


@pytest.mark.parametrize("api", SIM_APIS)
def test_a_card_tensor_moves_back_to_the_cpu(api):
    # _to_copy with a device kwarg: one device, not "got multiple values for 'device'".
    out = sim_json("to_cpu", api=api, cards=8)
    other = f"{DEVICE_TYPE[api]}:1"
    assert out == {
        "cpu": ["cpu", "Tensor", 3.0],
        "to_cpu": ["cpu", "Tensor", 3.0],
        "to_other_card": [other, "Tensor", 3.0],
    }


@needs_torch2
def test_torch_manual_seed_seeds_the_cards():
    # torch.manual_seed calls torch.gcu.manual_seed_all, which must not call it back (recursion).
    out = sim_json("seeds", api="gcu2", cards=2)
    assert out["a"] == out["b"] != out["c"]


@needs_torch2
@pytest.mark.parametrize("make", ["empty", "to"])
def test_a_tensor_on_a_missing_card_is_refused(make):
    proc = run_sim("missing_card", make, api="gcu2", cards=3, check=False)
    assert proc.returncode != 0
    assert "invalid" in proc.stderr


@needs_torch2
def test_resize_and_out_on_a_card():
    out = sim_json("resize_and_out", api="gcu2", cards=2)
    assert out["resized"] == [1024]
    assert out["out"] == [4]
    assert out["bytes"] == 1024 * 4 + 4 * 4 + 4 * 4


@pytest.mark.parametrize("api", SIM_APIS)
def test_out_arguments_are_written_in_card_memory(api):
    """An out= argument is written where it lives (a view writes its base), grown or
    restrided like a CPU tensor; a new result is card memory, counted."""
    out = sim_json("out_arguments", api=api, cards=1)
    card = DEVICE_TYPE[api]
    assert out["result"] == [card, 24, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]]
    assert out["into_view"] == [True, [[0.0] * 6, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]]
    assert out["grown"] == [[6], card, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]]
    assert out["restrided"] == [[6], [1], [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]]


@pytest.mark.parametrize("api", SIM_APIS)
def test_random_ops_draw_in_logical_order_on_a_transposed_card_tensor(api):
    # An XLA tensor has no strides (torch_xla 1.10 tensor_impl.cpp), so a T20 fills a
    # transposed tensor's random numbers in its logical order; torch 2.x's CPU kernels fill
    # memory order, so dropout on MaskFormer's transposed attention output draws another mask.
    out = sim_json("random_order", api=api, cards=2)
    assert out["same"] == {
        "dropout": True,
        "bernoulli_": True,
        "uniform_": True,
        "normal_": True,
        "rand_like": True,
    }
    assert out["in_place_reached"] is True


@pytest.mark.parametrize("api", SIM_APIS)
def test_gelu_backward_of_a_transposed_gradient_is_right_on_a_card(api):
    # torch 1.10's CPU kernel miscomputes it (DPT's loss turns NaN after a step on the T20
    # stack); a T20 has no strides, and torch_xla 1.10 lowers gelu_backward.
    assert sim_json("strided_kernels", api=api, cards=2)["max_diff"] < 1e-6
