"""One rank of the GCUSyncBatchNorm checks: ``python -m tests.model.sync_bn_ranks``.

Started by ``test_sync_bn.py`` as ``WORLD_SIZE`` processes (``RANK``, ``MASTER_ADDR``,
``MASTER_PORT`` set) over a gloo group on the CPU. Every rank builds every rank's inputs from
seeds, so each can compute the reference by itself: what SyncBN computes by definition, plain
BatchNorm in float32 over the concatenation of all ranks' batches in this one process. Each
rank compares its slice of the output and input gradient, the running statistics, and the
sums over ranks of its weight/bias gradients (an all-reduce outside the layer's group) with
the reference, and counts the all-reduces the layer makes. Prints one JSON line:
``{case: {quantity: relative error, ..., "fwd_calls": [...], "bwd_calls": [...]}}``.

Relative error of ``a`` against the reference ``b``: ``max |a - b| / (|b| + max |b|)``, i.e.
``assert_close(rtol=t, atol=t * max|b|)`` passes exactly when it is at most ``t``.
"""

import copy
import json
import os
import zlib
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

from mmgcu.device import CardGroup
from mmgcu.model.sync_bn import GCUSyncBatchNorm, convert_gcu_sync_batchnorm


class CountingGroup(CardGroup):
    """torch.distributed's group, recording the size of each all-reduce it makes."""

    def __init__(self, group=None):
        super().__init__(dist, group)
        self.calls = []

    def all_reduce(self, tensor):
        self.calls.append(tensor.numel())
        super().all_reduce(tensor)

    def take(self):
        calls, self.calls = self.calls, []
        return calls


def rel_err(a, b):
    if b.numel() == 0:
        return 0.0
    a, b = a.detach().double(), b.detach().double()
    scale = b.abs().max()
    return ((a - b).abs() / (b.abs() + scale + 1e-30)).max().item()


def _gen(*seed):
    """A generator seeded from ``seed`` alike in every process (``hash`` is salted)."""
    return torch.Generator().manual_seed(zlib.crc32(repr(seed).encode()))


def _shape(case, n):
    return [n, case["channels"]] + list(case.get("spatial", ()))


def _data(case, step, rank, batches, kind):
    g = _gen(case["name"], step, rank, kind)
    x = torch.randn(_shape(case, batches[rank]), generator=g)
    if kind == "x":
        x = x * case.get("std", 2.0) + case.get("offset", 0.5)
    return x


# Each case: channels, spatial dims (none: BatchNorm1d on (N, C)), batch per rank, options;
# ``dtype``: the layer's input dtype; ``autocast``: run the forward under CPU bf16 autocast.
CASES = {
    2: [
        dict(name="2d_affine_m0.1", channels=4, spatial=(5, 6), batches=[2, 3]),
        dict(
            name="2d_plain_mNone",
            channels=3,
            spatial=(4, 4),
            batches=[1, 2],
            affine=False,
            momentum=None,
        ),
        dict(name="1d_NC_affine_mNone", channels=5, batches=[1, 4], momentum=None),
        dict(name="1d_NCL_plain_m0.1", channels=3, spatial=(7,), batches=[3, 2], affine=False),
        dict(name="empty_rank", channels=4, spatial=(3, 3), batches=[0, 3]),
        dict(
            name="no_running_stats",
            channels=4,
            spatial=(3, 3),
            batches=[2, 1],
            track_running_stats=False,
        ),
        # |mean| / std = 200 with running means from a checkpoint: the shifted sums stay exact
        dict(
            name="offset_from_checkpoint",
            channels=4,
            spatial=(6, 6),
            batches=[2, 3],
            offset=200.0,
            std=1.0,
            preset_mean=200.0,
        ),
        dict(
            name="autocast_bf16",
            channels=4,
            spatial=(5, 6),
            batches=[2, 3],
            dtype="bfloat16",
            autocast=True,
        ),
        dict(
            name="input_fp16",
            channels=4,
            spatial=(5, 6),
            batches=[3, 1],
            dtype="float16",
            momentum=None,
        ),
    ],
    4: [
        dict(name="2d_affine_m0.1_uneven", channels=4, spatial=(4, 5), batches=[1, 2, 0, 3]),
        dict(
            name="1d_NC_plain_mNone", channels=6, batches=[2, 1, 3, 2], affine=False, momentum=None
        ),
        dict(
            name="autocast_bf16",
            channels=3,
            spatial=(4, 4),
            batches=[2, 1, 3, 1],
            dtype="bfloat16",
            autocast=True,
            momentum=None,
        ),
    ],
}
STEPS = 3


def _layers(case):
    kwargs = dict(
        eps=1e-5,
        momentum=case.get("momentum", 0.1),
        affine=case.get("affine", True),
        track_running_stats=case.get("track_running_stats", True),
    )
    c = case["channels"]
    ref = (
        nn.BatchNorm2d(c, **kwargs)
        if case.get("spatial") and len(case["spatial"]) == 2
        else nn.BatchNorm1d(c, **kwargs)
    )
    g = _gen(case["name"], "init")
    with torch.no_grad():
        if ref.affine:
            ref.weight.copy_(torch.rand(c, generator=g) + 0.5)
            ref.bias.copy_(torch.randn(c, generator=g))
        if "preset_mean" in case:
            ref.running_mean.copy_(case["preset_mean"] + 0.1 * torch.randn(c, generator=g))
            ref.running_var.fill_(case.get("std", 2.0) ** 2)
    layer = GCUSyncBatchNorm(c, **kwargs)
    layer.load_state_dict(ref.state_dict())
    return layer, ref


def run_case(case, rank, world):
    group = CountingGroup()
    layer, ref = _layers(case)
    layer.card_group = group
    batches = case["batches"]
    dtype = getattr(torch, case.get("dtype", "float32"))
    lo, hi = sum(batches[:rank]), sum(batches[: rank + 1])
    errs = {}

    def note(key, a, b):
        errs[key] = max(errs.get(key, 0.0), rel_err(a, b))

    fwd, bwd = [], []
    for step in range(STEPS):
        xs = [_data(case, step, r, batches, "x").to(dtype) for r in range(world)]
        gys = [_data(case, step, r, batches, "gy").to(dtype) for r in range(world)]
        # the reference sees the same (rounded) values, in float32
        x_ref = torch.cat(xs).float().requires_grad_()
        y_ref = ref(x_ref)
        y_ref.backward(torch.cat(gys).float())

        x = xs[rank].clone().requires_grad_()
        if case.get("autocast"):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = layer(x)
        else:
            y = layer(x)
        fwd.append(len(group.take()))
        y.backward(gys[rank])
        bwd.append(len(group.take()))
        assert y.dtype == dtype and x.grad.dtype == dtype, (y.dtype, x.grad.dtype)

        note("output", y.float(), y_ref[lo:hi])
        note("grad_input", x.grad.float(), x_ref.grad[lo:hi])
        if layer.affine:
            for name in ("weight", "bias"):
                total = getattr(layer, name).grad.clone()
                dist.all_reduce(total)  # what DDP's average is, times the world size
                note(f"grad_{name}", total, getattr(ref, name).grad)
                getattr(layer, name).grad = None
                getattr(ref, name).grad = None
        if layer.track_running_stats:
            note("running_mean", layer.running_mean, ref.running_mean)
            note("running_var", layer.running_var, ref.running_var)
            assert layer.num_batches_tracked.equal(ref.num_batches_tracked)

    layer.eval()
    ref.eval()
    xs = [_data(case, "eval", r, batches, "x").to(dtype) for r in range(world)]
    with torch.no_grad():
        y = layer(xs[rank])
        if layer.track_running_stats:
            y_ref = ref(torch.cat(xs).float())[lo:hi]
        else:  # BN in eval without running stats normalises each batch alone, as SyncBN does
            y_ref = ref(xs[rank].float())
        note("eval_output", y.float(), y_ref)
    errs["eval_calls"] = len(group.take())
    errs["fwd_calls"] = fwd
    errs["bwd_calls"] = bwd
    return errs


def _run_model(model, x, gys, group=None):
    """Outputs, input gradient, parameter gradients, running stats; all-reduces made."""
    x = x.clone().requires_grad_()
    outs = model(x)
    fwd = len(group.take()) if group else 0
    torch.autograd.backward(outs, gys)
    bwd = len(group.take()) if group else 0
    grads = {n: p.grad for n, p in model.named_parameters()}
    stats = {n: b for n, b in model.named_buffers() if n.endswith(("_mean", "_var"))}
    return (outs, x.grad, grads, stats), (fwd, bwd)


def run_mmseg_resnet(rank, world):
    """A converted ResNetV1c (``norm_cfg=dict(type='SyncBN')``) against BN on the union.

    Deep in the net float32 errors grow (the last stage normalises 12 values per channel), so
    both this rank's layers and stock float32 BN on the union are compared with float64 BN on
    the union: ``<quantity>`` is the converted model's error, ``<quantity>_bn32`` stock BN's.
    """
    from mmengine.model import revert_sync_batchnorm
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules

    register_all_modules()
    torch.manual_seed(0)
    model = MODELS.build(
        dict(
            type="ResNetV1c",
            depth=18,
            stem_channels=8,
            base_channels=8,
            norm_cfg=dict(type="SyncBN", requires_grad=True),
        )
    )
    ref = revert_sync_batchnorm(copy.deepcopy(model))
    ref.train()  # mmseg's ResNet.train returns None
    ref64 = copy.deepcopy(ref).double()
    n_sync = sum(isinstance(m, nn.SyncBatchNorm) for m in model.modules())
    group = CountingGroup()
    model = convert_gcu_sync_batchnorm(model, group)
    model.train()
    batches = [1, 2, 2, 1][:world]
    lo, hi = sum(batches[:rank]), sum(batches[: rank + 1])
    xs = [torch.randn(b, 3, 64, 64, generator=_gen("resnet", r)) for r, b in enumerate(batches)]
    x = torch.cat(xs)
    with torch.no_grad():
        gys = [torch.randn_like(o, dtype=torch.float64) for o in ref64(x.double())]
    ref64.load_state_dict(ref.state_dict())  # undo that pass's running-stat update

    truth, _ = _run_model(ref64, x.double(), gys)
    bn32, _ = _run_model(ref, x, [g.float() for g in gys])
    mine, (fwd, bwd) = _run_model(model, xs[rank], [g[lo:hi].float() for g in gys], group)

    def errors(outs, grad_x, grads, stats, part):
        cut = (lambda t: t[lo:hi]) if part else (lambda t: t)
        if part:  # this rank's parameter gradients, summed over the ranks
            grads = {n: g.clone() for n, g in grads.items()}
            for g in grads.values():
                dist.all_reduce(g)
        return {
            "output": max(rel_err(o, cut(t)) for o, t in zip(outs, truth[0])),
            "grad_input": rel_err(grad_x, cut(truth[1])),
            "grad_params": max(rel_err(g, truth[2][n]) for n, g in grads.items()),
            "running_stats": max(rel_err(b, truth[3][n]) for n, b in stats.items()),
        }

    out = {"n_sync_bn": n_sync, "fwd_calls": [fwd], "bwd_calls": [bwd]}
    out.update(errors(*mine, part=True))
    out.update({f"{k}_bn32": v for k, v in errors(*bn32, part=False).items()})
    return out


def run_mmcv_sync_bn(rank, world):
    """mmcv's MMSyncBN (it needs a process group to be built): convert and state dicts."""
    from mmcv.cnn import build_norm_layer

    name, mm = build_norm_layer(dict(type="MMSyncBN"), 6, postfix=1)
    with torch.no_grad():
        mm.running_mean.normal_()
        mm.running_var.uniform_(0.5, 2)
        mm.num_batches_tracked.fill_(7)
    mm.weight.requires_grad_(False)
    keys = list(mm.state_dict())
    tensors = [mm.weight, mm.bias, mm.running_mean, mm.running_var, mm.num_batches_tracked]
    group = CountingGroup()
    seq = convert_gcu_sync_batchnorm(nn.Sequential(mm), group)
    new = seq[0]
    out = {
        "name": name,
        "type": type(new).__name__,
        "group_set": new.card_group is group,
        "same_tensors": all(
            a is b
            for a, b in zip(
                tensors,
                [new.weight, new.bias, new.running_mean, new.running_var, new.num_batches_tracked],
            )
        ),
        "requires_grad": [new.weight.requires_grad, new.bias.requires_grad],
        "keys_equal": list(new.state_dict()) == keys,
    }
    # GCUSyncBN state dict -> a fresh MMSyncBN -> BatchNorm2d -> GCUSyncBN, all strict
    mm2 = build_norm_layer(dict(type="MMSyncBN"), 6)[1]
    mm2.load_state_dict(new.state_dict())
    bn = nn.BatchNorm2d(6)
    bn.load_state_dict(mm2.state_dict())
    back = GCUSyncBatchNorm(6)
    back.load_state_dict(bn.state_dict())
    out["round_trip"] = all(
        torch.equal(a, b) for a, b in zip(back.state_dict().values(), new.state_dict().values())
    )
    # and it trains as a synchronised layer
    x = torch.randn(rank + 1, 6, 3, 3).requires_grad_()
    new(x).sum().backward()
    out["calls"] = len(group.take())
    return out


#: Why a case cannot run on this torch (None: it can).
def unsupported(case):
    if case.get("dtype", "float32") != "float32" and torch.__version__.startswith("1."):
        return "torch 1.10's CPU has no half-precision batch_norm for the reference"
    return None


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    results = {}
    for case in CASES[world]:
        if unsupported(case) is None:
            results[case["name"]] = run_case(case, rank, world)
    if world == 2:
        results["mmseg_resnet"] = run_mmseg_resnet(rank, world)
        results["mmcv_sync_bn"] = run_mmcv_sync_bn(rank, world)
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
