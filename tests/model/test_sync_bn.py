"""GCUSyncBatchNorm: SyncBN from ordinary ops and one all-reduce per pass.

torch's ``nn.SyncBatchNorm`` cannot run on the CPU, so the reference is what SyncBN computes
by definition: BatchNorm over the concatenation of all ranks' batches, in one process. The
multi-rank checks run real gloo groups of 2 and 4 processes (``sync_bn_ranks.py``, started
once per world size for all cases), two ranks on simulated cards of each torch_gcu API, and
the benchmark's smoke run; the rest run in this process, with ``Twin``: a group of two ranks
that hold the same batch (its all-reduce doubles), or on the meta device.

Tolerances, as ``max |a - b| / (|b| + max |b|)`` (``assert_close(rtol=t, atol=t*max|b|)``):
float32 1e-5 for everything. For bfloat16/float16 inputs the reference is float32 BN over the
same rounded inputs and output gradients, so statistics, running stats and weight/bias
gradients (all float32 in the layer) keep 1e-5; the output and the input gradient are
rounded once to the input's dtype, so they get its machine epsilon (2**-7 for bfloat16,
2**-10 for float16), twice the largest rounding error.
"""

import copy
import importlib.util
import os
import pickle
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmengine.model import revert_sync_batchnorm
from mmengine.registry import MODELS
from torch.nn.modules.batchnorm import _BatchNorm

from mmgcu.model.sync_bn import (
    GCUSyncBatchNorm,
    convert_gcu_sync_batchnorm,
    revert_gcu_sync_batchnorm,
)
from tests.conftest import REPO, SIM_APIS, clean_env, free_port, last_json, one_worker
from tests.model.sync_bn_ranks import CASES, STEPS, rel_err, unsupported
from tests.sim.helpers import DEVICE_TYPE
from tests.sim.helpers import run_ranks as run_sim_ranks

FP32_TOL = 1e-5
ROUNDED_TOL = {"bfloat16": 2.0**-7, "float16": 2.0**-10}
ROUNDED = ("output", "grad_input", "eval_output")


# -- real process groups ----------------------------------------------------------------
def run_ranks(world_size, timeout=300):
    """Each rank's JSON from ``python -m tests.model.sync_bn_ranks`` on a gloo group."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.model.sync_bn_ranks"],
            env=clean_env(
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                RANK=rank,
                WORLD_SIZE=world_size,
                OMP_NUM_THREADS=1,
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for rank in range(world_size)
    ]
    try:
        outputs = [proc.communicate(timeout=timeout) for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        outputs = [proc.communicate() for proc in procs]
        raise AssertionError(f"ranks timed out after {timeout}s: {outputs}") from None
    if any(proc.returncode for proc in procs):
        raise AssertionError(
            "\n".join(
                f"--- rank {r} (exit {p.returncode})\n{out}\n{err}"
                for r, (p, (out, err)) in enumerate(zip(procs, outputs))
            )
        )
    return [last_json(out) for out, _ in outputs]


_results = {}
#: The tests that read :func:`results`: one worker runs them, so each world size runs once.
SHARED_RUNS = one_worker("sync_bn_ranks")


def results(world_size):
    """The ranks' results for ``world_size``, run once per test session."""
    if world_size not in _results:
        _results[world_size] = run_ranks(world_size)
    return _results[world_size]


def worst(world_size, case, key):
    """The largest value of ``key`` over the ranks."""
    return max(rank[case][key] for rank in results(world_size))


@SHARED_RUNS
@pytest.mark.parametrize(
    "world_size,case",
    [(w, c) for w in sorted(CASES) for c in CASES[w]],
    ids=[f"{w}ranks-{c['name']}" for w in sorted(CASES) for c in CASES[w]],
)
def test_matches_batchnorm_over_all_ranks(world_size, case):
    if unsupported(case):
        pytest.skip(unsupported(case))
    name = case["name"]
    keys = ["output", "grad_input", "eval_output"]
    if case.get("affine", True):
        keys += ["grad_weight", "grad_bias"]
    if case.get("track_running_stats", True):
        keys += ["running_mean", "running_var"]
    dtype = case.get("dtype", "float32")
    errors = {k: worst(world_size, name, k) for k in keys}
    limits = {
        k: ROUNDED_TOL[dtype] if dtype in ROUNDED_TOL and k in ROUNDED else FP32_TOL for k in keys
    }
    assert all(errors[k] <= limits[k] for k in keys), (errors, limits)
    for rank in results(world_size):
        # one all-reduce per training forward and per backward, none in eval
        assert rank[name]["fwd_calls"] == [1] * STEPS
        assert rank[name]["bwd_calls"] == [1] * STEPS
        assert rank[name]["eval_calls"] == 0


@SHARED_RUNS
def test_converted_mmseg_resnet_matches_batchnorm_over_both_ranks():
    # ResNetV1c-18 built with norm_cfg=dict(type='SyncBN'), converted, on batches of 1 and 2,
    # and stock float32 BN on both batches, against float64 BN on both batches. 18 layers
    # deep float32 errors grow, so the converted model must be as close to float64 as stock
    # float32 BN is (within a factor 4), or within 1e-5.
    for rank in results(2):
        r = rank["mmseg_resnet"]
        assert r["n_sync_bn"] == 22  # deep stem 3, BasicBlocks 16, downsample 3
        assert r["fwd_calls"] == [22] and r["bwd_calls"] == [22]
        for key in ("output", "grad_input", "grad_params", "running_stats"):
            assert r[key] <= max(4 * r[f"{key}_bn32"], FP32_TOL), (key, r)


@SHARED_RUNS
def test_converted_mmcv_sync_bn_keeps_tensors_and_state_dict():
    for rank in results(2):
        r = rank["mmcv_sync_bn"]
        assert r == {
            "name": "bn1",
            "type": "GCUSyncBatchNorm",
            "group_set": True,
            "same_tensors": True,
            "requires_grad": [False, True],
            "keys_equal": True,
            "round_trip": True,
            "calls": 2,
        }


# -- one process --------------------------------------------------------------------------
class Twin:
    """Two ranks holding the same batch: the all-reduce doubles. Records each call's size."""

    world_size = 2

    def __init__(self):
        self.calls = []

    def all_reduce(self, tensor):
        self.calls.append(tensor.numel())
        tensor.mul_(2)


class Single(Twin):
    world_size = 1


def _pair(cls=nn.BatchNorm2d, channels=4, **kwargs):
    torch.manual_seed(0)
    ref = cls(channels, **kwargs)
    if ref.affine:
        with torch.no_grad():
            ref.weight.uniform_(0.5, 1.5)
            ref.bias.normal_()
    layer = GCUSyncBatchNorm(channels, **kwargs)
    layer.load_state_dict(ref.state_dict())
    return layer, ref


def test_registered_as_gcusyncbn_and_named_bn_by_mmcv():
    assert MODELS.get("GCUSyncBN") is GCUSyncBatchNorm
    name, layer = build_norm_layer(dict(type="GCUSyncBN", requires_grad=False), 8, postfix=1)
    assert name == "bn1"
    assert isinstance(layer, GCUSyncBatchNorm) and isinstance(layer, _BatchNorm)
    assert layer.card_group is None and layer.eps == 1e-5
    assert not layer.weight.requires_grad and not layer.bias.requires_grad
    with pytest.raises(ValueError, match="at least 2D"):
        layer(torch.randn(8))


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("mode", ["no group", "one rank", "eval"])
def test_is_batchnorm_without_a_group_of_several_ranks(mode, momentum):
    layer, ref = _pair(momentum=momentum)
    group = Single() if mode == "one rank" else Twin()
    layer.card_group = None if mode == "no group" else group
    if mode == "eval":
        layer.eval()
        ref.eval()
    for _ in range(3):
        x = torch.randn(3, 4, 5, 5) * 2 + 1
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        y1, y2 = layer(x1), ref(x2)
        gy = torch.randn_like(y1)
        y1.backward(gy)
        y2.backward(gy)
        assert torch.equal(y1, y2) and torch.equal(x1.grad, x2.grad)
        assert torch.equal(layer.weight.grad, ref.weight.grad)
        for a, b in zip(layer.state_dict().values(), ref.state_dict().values()):
            assert torch.equal(a, b)
    assert group.calls == []


def test_one_all_reduce_forward_and_one_backward():
    layer, ref = _pair(channels=5)
    layer.card_group = group = Twin()
    x = torch.randn(2, 5, 3, 3, requires_grad=True)
    y = layer(x)
    assert group.calls == [2 * 5 + 1]  # sum, sum of squares, count
    y.sum().backward()
    assert group.calls == [11, 2 * 5]  # sum(dy), sum(dy * xhat)
    # a layer on data (input without gradient) needs only local weight/bias gradients
    group.calls.clear()
    layer(torch.randn(2, 5, 3, 3)).sum().backward()
    assert group.calls == [11]


def test_two_identical_ranks_are_batchnorm_on_the_doubled_batch():
    # The same layer, group faked in this process (the gloo runs are the real test).
    layer, ref = _pair(nn.BatchNorm1d, channels=3, momentum=None)
    layer.card_group = Twin()
    for _ in range(3):
        x = torch.randn(4, 3, 6).requires_grad_()
        x2 = torch.cat([x.detach(), x.detach()]).requires_grad_()
        gy = torch.randn(4, 3, 6)
        layer(x).backward(gy)
        y2 = ref(x2)
        y2.backward(torch.cat([gy, gy]))
        assert rel_err(x.grad, x2.grad[:4]) <= FP32_TOL
        assert rel_err(2 * layer.weight.grad, ref.weight.grad) <= FP32_TOL
        layer.weight.grad = ref.weight.grad = None
    assert rel_err(layer.running_var, ref.running_var) <= FP32_TOL
    assert torch.equal(layer.num_batches_tracked, ref.num_batches_tracked)


def test_shifted_sums_keep_the_variance_where_e_x2_minus_mean2_does_not():
    # Channels with |mean| / std = 200, running means near the batch means (a checkpoint, or
    # any step after the first): the layer stays within 1e-5 of a float64 reference; the
    # textbook E[x^2] - E[x]^2 in float32 over the same data does not.
    gen = torch.Generator().manual_seed(1)
    xf = torch.randn(4, 3, 8, 8, generator=gen) + 200
    x = xf.double()
    var64 = x.var((0, 2, 3), unbiased=False)
    naive = (xf * xf).mean((0, 2, 3)) - xf.mean((0, 2, 3)) ** 2
    assert rel_err(naive.double(), var64) > 1e-3

    layer = GCUSyncBatchNorm(3, momentum=1.0, affine=False, card_group=Twin())
    with torch.no_grad():
        layer.running_mean.fill_(199.9)
    y = layer(xf)
    ref = (x - x.mean((0, 2, 3), keepdim=True)) / (var64.view(1, 3, 1, 1) + 1e-5).sqrt()
    assert rel_err(y.double(), ref) <= FP32_TOL
    n = x.numel() / 3 * 2
    assert rel_err(layer.running_var.double(), var64 * n / (n - 1)) <= FP32_TOL


class HostReads(getattr(torch.overrides, "TorchFunctionMode", object)):
    """Records every tensor method that copies a value to the host."""

    NAMES = {"item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__"}

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.NAMES or (name == "to" and "cpu" in map(str, args[1:])):
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("momentum", [0.1, None])
def test_no_host_reads_on_cpu_tensors(momentum):
    if not hasattr(torch.overrides, "TorchFunctionMode"):
        pytest.skip("TorchFunctionMode is torch >= 1.13")
    # the trap catches stock BN's float(num_batches_tracked) for momentum=None
    bn = nn.BatchNorm2d(4, momentum=None)
    with HostReads() as trap:
        bn(torch.randn(2, 4, 3, 3))
    assert trap.reads == ["__float__"]

    layer, _ = _pair(momentum=momentum)
    layer.card_group = Twin()
    x = torch.randn(2, 4, 3, 3, requires_grad=True)
    with HostReads() as trap:
        for _ in range(2):
            layer(x).sum().backward()
    assert trap.reads == []


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("shape", [(2, 4, 3, 3), (0, 4, 3, 3), (3, 4)])
@pytest.mark.skipif(
    torch.__version__.startswith("1."),
    reason="torch 1.10's meta backend has no torch.cat; there the simulated-card test counts "
    "the host reads instead",
)
def test_no_host_reads_on_the_meta_device(shape, momentum):
    # Meta tensors hold no values: item(), bool(), float() and .cpu() all raise on them.
    stock = nn.BatchNorm2d(4, momentum=None).to("meta")
    with pytest.raises((RuntimeError, NotImplementedError), match="[Mm]eta"):  # 1.10: NotImpl.
        stock(torch.empty(2, 4, 3, 3, device="meta"))

    layer = GCUSyncBatchNorm(4, momentum=momentum, card_group=Twin()).to("meta")
    x = torch.empty(shape, device="meta", requires_grad=True)
    y = layer(x)
    y.backward(torch.empty_like(y))
    assert x.grad.shape == x.shape and layer.weight.grad.shape == (4,)
    assert layer.card_group.calls == [9, 8]


def test_state_dict_round_trips_with_bn_and_syncbn():
    _, syncbn = build_norm_layer(dict(type="SyncBN"), 6)  # what stock configs build
    bn = nn.BatchNorm2d(6)
    gcu = GCUSyncBatchNorm(6, card_group=Twin())
    gcu(torch.randn(3, 6, 2, 2) * 3 + 1)  # running stats and count away from the defaults
    for other in (bn, syncbn):
        assert list(other.state_dict()) == list(gcu.state_dict())
        other.load_state_dict(gcu.state_dict())
        fresh = GCUSyncBatchNorm(6)
        fresh.load_state_dict(other.state_dict())
        for a, b in zip(fresh.state_dict().values(), gcu.state_dict().values()):
            assert torch.equal(a, b)


def _resnet(norm="SyncBN"):
    from mmseg.registry import MODELS as SEG_MODELS
    from mmseg.utils import register_all_modules

    register_all_modules()
    return SEG_MODELS.build(
        dict(
            type="ResNetV1c",
            depth=18,
            stem_channels=8,
            base_channels=8,
            norm_cfg=dict(type=norm, requires_grad=True),
        )
    )


def test_convert_replaces_every_syncbn_of_an_mmseg_model_and_keeps_names():
    model = nn.Sequential(_resnet("SyncBN"), nn.BatchNorm2d(3))
    model[0].layer4.eval()
    before = {n: type(m) for n, m in model.named_modules()}
    keys = list(model.state_dict())
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    plain = model[1]
    training = {n: m.training for n, m in model.named_modules()}
    # deep stem 3, two per BasicBlock 16, downsample of stages 2-4 3
    assert sum(issubclass(t, nn.SyncBatchNorm) for t in before.values()) == 22

    group = Twin()
    out = convert_gcu_sync_batchnorm(model, group)
    after = {n: type(m) for n, m in out.named_modules()}
    assert list(after) == list(before)
    assert list(out.state_dict()) == keys
    assert not any(issubclass(t, nn.SyncBatchNorm) for t in after.values())
    for name, cls in before.items():
        if issubclass(cls, nn.SyncBatchNorm):
            assert after[name] is GCUSyncBatchNorm, name
            assert out.get_submodule(name).card_group is group
    assert out[1] is plain and type(plain) is nn.BatchNorm2d
    assert all(p is params[n] for n, p in out.named_parameters())
    assert all(b is buffers[n] for n, b in out.named_buffers())
    assert {n: m.training for n, m in out.named_modules()} == training

    # a model built with GCUSyncBN has the same names, keys and shapes
    built = _resnet("GCUSyncBN")
    assert {n: type(m) for n, m in built.named_modules() if n} == {
        n[2:]: t for n, t in after.items() if n.startswith("0.")
    }
    built.load_state_dict(out[0].state_dict())

    # a lone SyncBN layer is itself replaced; existing GCUSyncBN layers get the group
    assert isinstance(convert_gcu_sync_batchnorm(nn.SyncBatchNorm(3), group), GCUSyncBatchNorm)
    assert convert_gcu_sync_batchnorm(built, group).layer1[0].bn1.card_group is group


def test_revert_gives_batchnorm_with_the_same_tensors():
    model = nn.Sequential(GCUSyncBatchNorm(4, card_group=Twin()), nn.Conv2d(4, 4, 1))
    assert revert_sync_batchnorm(copy.deepcopy(model))[0].__class__ is GCUSyncBatchNorm
    layer = model[0]
    out = revert_gcu_sync_batchnorm(model)
    assert type(out[0]).__name__ == "_BatchNormXd"
    assert out[0].weight is layer.weight and out[0].running_var is layer.running_var
    assert list(out.state_dict()) == [
        "0.weight",
        "0.bias",
        "0.running_mean",
        "0.running_var",
        "0.num_batches_tracked",
        "1.weight",
        "1.bias",
    ]


class Uncopyable(Twin):
    def __reduce_ex__(self, protocol):
        raise TypeError("cannot pickle 'ProcessGroup' object")


def test_deepcopy_shares_the_group_and_pickle_drops_it():
    model = nn.Sequential(GCUSyncBatchNorm(4, card_group=Uncopyable()))
    twin = copy.deepcopy(model)  # what an EMA hook does
    assert twin[0].card_group is model[0].card_group
    assert twin[0].weight is not model[0].weight
    assert torch.equal(twin[0].weight, model[0].weight)
    restored = pickle.loads(pickle.dumps(model))
    assert restored[0].card_group is None
    assert model[0].card_group is not None


def test_benchmark_reports_one_collective_each_way_and_its_peer_agrees():
    path = os.path.join(REPO, "tools", "benchmarks", "sync_bn.py")
    spec = importlib.util.spec_from_file_location("sync_bn_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.measure(shapes=[(2, 8, 4, 4)], number=1, repeat=1, timeout=240)
    row = out["shapes"]["2x8x4x4"]
    assert out["world_size"] == 2
    assert row["collectives_forward"] == 1 and row["floats_forward"] == [17]
    assert row["collectives_backward"] == 1 and row["floats_backward"] == [16]
    assert all(row[f"{v}_ms"] > 0 for v in bench.VARIANTS)
    # the peer, torch's SyncBatchNorm algorithm on the same group, computes the same layer
    assert row["max_abs_diff_vs_torch"] <= 1e-5


# -- simulated cards ----------------------------------------------------------------------
# Two ranks on simulated cards, each generation's card group as GCURunner gets it from the
# accelerator (torch_gcu 2.x: torch.distributed's default group with ECCL for card tensors;
# 1.x: torch_gcu.distributed's ECCL group), against BN on the CPU over both batches.
SIM_WORKER = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "programs", "sync_bn_on_cards.py"
)


@pytest.mark.parametrize("api", SIM_APIS)
def test_runs_on_simulated_cards_over_eccl(api):
    outs = run_sim_ranks(SIM_WORKER, MMGCU_SIMULATE=2, MMGCU_SIMULATE_API=api)
    for rank, out in enumerate(outs):
        card = f"{DEVICE_TYPE[api]}:{rank}"
        assert out["device"] == card
        assert out["calls"] == [card] * 4  # forward and backward of two steps, on the card
        assert out["err"] < 1e-5
        assert out["host_reads"] == 0  # a lazy card would wait for each one
