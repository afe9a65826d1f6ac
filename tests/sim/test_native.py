"""The simulator's native part alone, on whichever torch runs the tests (2.x or 1.10).

Each test group loads the extension straight from ``mmgcu/sim/build.py`` (not through
``mmgcu.sim.install``) and installs it in a fresh interpreter: a process installs cards once,
and renames PrivateUse1 to ``gcu`` once. Cards are ``xla`` on both torch generations (the
torch_gcu 1.x device type) and also ``gcu`` on torch >= 2 (torch_gcu 2.x).
"""

import importlib.util
import os
import os.path as osp
import shutil
import sys

import pytest
import torch

from tests.conftest import REPO, last_json, run_program

BUILD_PY = osp.join(REPO, "mmgcu", "sim", "build.py")
TORCH2 = int(torch.__version__.split(".")[0]) >= 2
DEVICE_TYPES = ["xla", "gcu"] if TORCH2 else ["xla"]


def load_build_module():
    """mmgcu/sim/build.py as a module of its own (the mmgcu package is not imported)."""
    spec = importlib.util.spec_from_file_location("mmgcu_sim_build", BUILD_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def native_json(program, kind="xla", cards=4):
    """Run ``programs/<program>.py`` on ``cards`` simulated cards of ``kind``; its last JSON."""
    path = osp.join(osp.dirname(__file__), "programs", program + ".py")
    return last_json(run_program(path, kind, cards, timeout=600).stdout)


# ---------------------------------------------------------------------------- placement


@pytest.mark.parametrize("kind", DEVICE_TYPES)
def test_tensors_land_on_the_card(kind):
    out = native_json("native_placement", kind=kind)
    d0, d1 = f"{kind}:0", f"{kind}:1"
    assert out["factories"] == {
        "empty": d1,
        "zeros": d0,
        "ones": d0,
        "full": d0,
        "arange": d0,
        "rand": d0,
        "randn": d0,
        "strided": d0,
    }
    assert out["strided_stride"] == [1, 2]
    assert out["roundtrip"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert out["card_to_card"] == d1
    assert out["card_to_card_values"] == out["roundtrip"]
    assert out["inplace"] == [True, d0, [2.0, 2.0, 2.0]]
    assert out["view_shares"] == [[7.0, 0.0], [7.0, 0.0]]
    assert out["view_device"] == d0
    assert out["reshape_shares"] == [[1.0, 2.0], [3.0, 4.0]]
    assert out["out"] == [True, d0, [2.0, 2.0, 2.0]]
    assert out["cpu_indices"] == [0.0, 2.0]
    assert out["cpu_scalar_mixes"] == [2.0, 2.0, 2.0]
    assert out["sum_device"] == d1
    assert out["current"] == 2
    assert out["default_card"] == f"{kind}:2"  # an index-less device means the current card
    assert "ordinal 7 is invalid: 4 card(s)" in out["invalid"]
    assert out["mem_after_alloc"] == 4000
    assert out["mem_other_card"] == 0
    assert out["mem_after_free"] == 0
    assert out["peak"] == 4000
    assert out["peak_after_reset"] == 0
    assert out["card_count"] == 4


# ---------------------------------------------------------------------------- devices


@pytest.mark.parametrize("kind", DEVICE_TYPES)
def test_mixed_devices_fail_with_pytorchs_own_error(kind):
    out = native_json("native_same_device", kind=kind)
    for case, message in out.items():
        assert message is not None, case
        assert "Expected all tensors to be on the same device" in message, (case, message)
    assert "cpu" in out["cpu_and_card"] and f"{kind}:0" in out["cpu_and_card"]
    assert f"{kind}:0" in out["two_cards"] and f"{kind}:1" in out["two_cards"]


# ---------------------------------------------------------------------------- convolution


@pytest.mark.parametrize("kind", DEVICE_TYPES)
def test_convolution_forward_and_backward_equal_cpu(kind):
    out = native_json("native_conv", kind=kind)
    for case, result in out.items():
        assert set(result.pop("devices")) == {f"{kind}:0"}, case
        assert all(result.values()), (case, result)


# ---------------------------------------------------------------------------- half precision


@pytest.mark.parametrize("kind", DEVICE_TYPES)
def test_half_precision_keeps_its_dtype_and_is_close_to_float32(kind):
    out = native_json("native_half", kind=kind)
    card = f"{kind}:0"
    for dtype in ("float16", "bfloat16"):
        res = out[dtype]
        want = f"torch.{dtype}"
        assert res.pop("conv_grads") == [[want, card, True]] * 3, dtype
        assert res.pop("linear_grad") == [want, card], dtype
        for case, result in res.items():
            assert result == [want, card, True], (dtype, case, result)
    assert out["mixed"] is not None


# ---------------------------------------------------------------------------- conformance
# What a strided card (torch_gcu 2.x, PrivateUse1) refuses where an XLA card does not: a view
# its strides cannot express, and torch's composite group norm on a channels-last tensor
# (math_group_norm views its input; no native_group_norm kernel for the device).
STRIDED_REFUSALS = {"view_of_transposed", "group_norm"}
VIEW_REFUSED = "view size is not compatible with input tensor's size and stride"


@pytest.mark.parametrize("kind", DEVICE_TYPES)
def test_op_classes_on_non_contiguous_and_half_card_tensors(kind):
    """Norms, matrix products, convolution, pooling, indexing, reductions, views, in-place
    and out= on transposed and permuted card tensors, in float32, float16 and bfloat16,
    forward and backward, against the CPU in float32. An XLA card (torch_gcu 1.x) has no
    strides to refuse (torch_xla/csrc/tensor_impl.cpp: every XLA tensor is contiguous, its
    strides computed from its shape), so "view size is not compatible ..." in layer_norm on a
    transposed patch embedding would be the simulator's, not the T20's; torch 1.10's CPU lacks half
    kernels a card has (batch norm under autocast, as on CUDA)."""
    out = native_json("native_conformance", kind=kind, cards=2)
    for dtype in ("float32", "float16", "bfloat16"):
        for case, (ok, got_dtype, error) in out[dtype].items():
            if kind == "gcu" and case in STRIDED_REFUSALS:
                assert not ok and VIEW_REFUSED in error, (dtype, case, error)
                continue
            assert ok and error is None, (dtype, case, got_dtype, error)
            assert got_dtype == f"torch.{dtype}", (dtype, case, got_dtype)
    # A half input with float32 weight and statistics, as under autocast: the output and its
    # gradient keep the input's half type, the statistics and the weight's gradient float32.
    assert out["batch_norm_mixed"] == [
        "torch.float16",
        "torch.float32",
        "torch.float16",
        "torch.float32",
        True,
    ]


# ---------------------------------------------------------------------------- host reads


@pytest.mark.parametrize("kind", DEVICE_TYPES)
def test_host_reads_are_counted(kind):
    reads = native_json("native_host_reads", kind=kind)
    counts = {k: (v["scalar_reads"], v["copies_to_host"]) for k, v in reads.items()}
    assert counts == {
        "start": (0, 0),
        "card_work": (0, 0),  # ops, uploads, card-to-card copies and host_alias read nothing
        "item": (1, 0),
        "float": (2, 0),
        "bool": (3, 0),
        "int": (4, 0),
        "cpu": (4, 1),
        "to_cpu": (4, 2),
        "tolist": (4, 3),
        "numpy": (4, 4),
        "copy_": (4, 5),
        "threads": (800, 0),
        "reset": (0, 0),
    }


# ---------------------------------------------------------------------------- grad scaler


@pytest.mark.parametrize("kind", DEVICE_TYPES)
def test_grad_scaler_kernels_match_the_cuda_semantics(kind):
    # On torch 1.10 these are the simulator's own kernels (CPU has none); on torch >= 2 the
    # CPU kernels run through the fallback: the same semantics either way.
    out = native_json("native_amp", kind=kind)
    card = f"{kind}:0"
    for values, found, devices in out["unscale"]:
        assert values and found and set(devices) == {card}
    assert out["half"] == ["torch.float16", True, 0.0]
    assert out["update"] == [[True, True, True, card, card]] * 13
    assert out["host_reads"] == {"scalar_reads": 0, "copies_to_host": 0}
    assert out["bad_tracker"] is not None and "growth_tracker" in out["bad_tracker"]


# ---------------------------------------------------------------------------- build
def test_build_picks_the_source_for_the_torch_generation():
    build = load_build_module()
    assert osp.basename(build.source_for("2.13.0+cpu")) == "gcu_sim.cpp"
    assert osp.basename(build.source_for("2.1.0")) == "gcu_sim.cpp"
    assert osp.basename(build.source_for("1.10.2+cu102")) == "gcu_sim_torch110.cpp"
    assert osp.basename(build.source_for("1.10.0a0+git36449ea")) == "gcu_sim_torch110.cpp"
    for version in ("1.9.0", "1.11.0", "1.13.1"):
        with pytest.raises(RuntimeError, match="torch >= 2 .* or torch 1.10"):
            build.source_for(version)


def test_build_key_covers_every_source_and_the_toolchain(tmp_path, monkeypatch):
    build = load_build_module()
    for name in os.listdir(build.CSRC):
        shutil.copy(osp.join(build.CSRC, name), tmp_path / name)
    monkeypatch.setattr(build, "CSRC", str(tmp_path))
    source = str(tmp_path / "gcu_sim.cpp")

    def key():
        return build.build_key(source, "2.13.0", "/usr/bin/ninja")

    first = key()
    assert key() == first
    assert build.build_key(source, "2.13.0", "/venv/bin/ninja") != first
    assert build.build_key(source, "1.10.2", "/usr/bin/ninja") != first
    for name in ("gcu_sim.h", "gcu_sim_torch110.cpp"):
        before = key()
        with open(tmp_path / name, "a") as f:
            f.write("\n// changed\n")
        assert key() != before, name


def test_build_runs_the_ninja_of_its_own_environment(tmp_path, monkeypatch):
    # However PATH is set (an activated venv or none), the build finds the ninja beside
    # sys.executable first, so two shells never rebuild each other's build folder.
    build = load_build_module()
    env_bin = tmp_path / "env" / "bin"
    env_bin.mkdir(parents=True)
    ninja = env_bin / "ninja"
    ninja.write_text("#!/bin/sh\n")
    ninja.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(env_bin / "python"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with build._env_bin_first_on_path():
        assert shutil.which("ninja") == str(ninja)
    assert os.environ["PATH"] == "/usr/bin:/bin"
