"""What one GCUSyncBatchNorm layer costs against BatchNorm2d, on gloo ranks on the CPU.

``measure()`` starts ``world_size`` processes of this script (a gloo group over TCP on
127.0.0.1, ``OMP_NUM_THREADS=threads`` each). Every rank times, per shape (the per-rank
batch, ``N x C x H x W``), one training forward + backward of

- ``bn``: ``nn.BatchNorm2d`` (each rank alone),
- ``gcu_sync_bn``: ``GCUSyncBatchNorm`` over the gloo group (a ``CardGroup`` over
  torch.distributed),
- ``gcu_sync_bn_local``: the same layer over a group of 2 whose all-reduce does nothing: the
  cost of its ordinary ops alone, what a card pays apart from the collectives,
- ``torch_sync_bn``: ``torch.nn.SyncBatchNorm``'s algorithm and collectives over the same
  group (``torch_sync_bn.py``: torch's layer refuses CPU inputs), the peer,
- ``all_reduce``: one gloo all-reduce of the forward's ``2C + 1`` float32 values (the
  layer's card group sums a tensor this small over gloo through rank 0 instead),

with :mod:`timeit` (``number`` calls per timing, ``repeat`` timings, the variants interleaved,
the ranks lined up by a barrier before each timing), and counts the layer's sums over its
card group and their sizes for one call, and how far the two SyncBN layers' outputs and input
gradients lie apart. Returns (and ``__main__`` prints) a dict: per shape the median milliseconds per
call of rank 0 and the slowest rank, ``gcu_sync_bn / torch_sync_bn``, ``/ bn``, the counts.
On the CPU the gloo round trips dominate; on a card the local ops and ECCL's latency do.

    python tools/benchmarks/sync_bn.py [--world-size 2] [--number 20] [--repeat 5]
"""

import argparse
import functools
import json
import os
import os.path as osp
import socket
import statistics
import subprocess
import sys
import timeit

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEFAULT_SHAPES = ((2, 64, 64, 64), (2, 256, 16, 16))
VARIANTS = ("bn", "gcu_sync_bn", "torch_sync_bn", "gcu_sync_bn_local", "all_reduce")


def _name(shape):
    return "x".join(str(s) for s in shape)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_rank(rank, port, shapes, world_size, number, repeat, threads, python):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MMGCU_", "TOPS_"))}
    env.update(
        PYTHONPATH=REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
    )
    cmd = [python, osp.abspath(__file__), "--rank-child", "--number", str(number)]
    cmd += ["--repeat", str(repeat), "--shapes", ",".join(_name(s) for s in shapes)]
    return subprocess.Popen(
        cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait(procs, timeout):
    """Each rank's JSON result; raises if one failed or ran past ``timeout``."""
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        outputs = [p.communicate() for p in procs]
        raise RuntimeError(f"sync_bn benchmark ranks timed out after {timeout}s") from None
    failed = [r for r, p in enumerate(procs) if p.returncode != 0]
    if failed:
        report = "\n".join(f"--- rank {r}\n{outputs[r][1]}" for r in failed)
        raise RuntimeError(f"sync_bn benchmark rank(s) {failed} failed:\n{report}")
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


def _shape_row(ranks, key):
    row = {}
    for variant in VARIANTS:
        row[f"{variant}_ms"] = ranks[0][key][variant]
        row[f"{variant}_ms_slowest_rank"] = max(r[key][variant] for r in ranks)
    row["gcu_sync_bn_over_bn"] = row["gcu_sync_bn_ms"] / row["bn_ms"]
    row["gcu_sync_bn_over_torch"] = row["gcu_sync_bn_ms"] / row["torch_sync_bn_ms"]
    row["slowest_rank_over_torch"] = (
        row["gcu_sync_bn_ms_slowest_rank"] / row["torch_sync_bn_ms_slowest_rank"]
    )
    row["max_abs_diff_vs_torch"] = max(r[key]["max_abs_diff_vs_torch"] for r in ranks)
    row["gcu_sync_bn_local_over_bn"] = row["gcu_sync_bn_local_ms"] / row["bn_ms"]
    row.update(ranks[0][key]["collectives"])
    return row


def measure(
    shapes=DEFAULT_SHAPES,
    world_size=2,
    number=20,
    repeat=5,
    threads=1,
    python=sys.executable,
    timeout=600,
):
    """Run the ranks; return the per-shape timings (ms per call) and collective counts."""
    port = _free_port()
    procs = [
        _start_rank(rank, port, shapes, world_size, number, repeat, threads, python)
        for rank in range(world_size)
    ]
    ranks = _wait(procs, timeout)
    return {
        "world_size": world_size,
        "threads": threads,
        "number": number,
        "repeat": repeat,
        "timer": "timeit, median of repeat timings of number calls, ms per call",
        "shapes": {_name(shape): _shape_row(ranks, _name(shape)) for shape in shapes},
    }


# -- one rank ------------------------------------------------------------------------------
def _train_step(layer, x, gy):
    def run():
        x.grad = None
        layer(x).backward(gy)

    return run


def _groups(dist):
    """A card group over torch.distributed that counts its all-reduces, and a group of 2
    whose all-reduce does nothing."""
    from mmgcu.device import CardGroup

    class Counting(CardGroup):
        def __init__(self):
            super().__init__(dist)
            self.sizes = []

        def all_reduce(self, tensor):
            self.sizes.append(tensor.numel())
            super().all_reduce(tensor)

    class NoComm:
        world_size = 2

        def all_reduce(self, tensor):
            pass

    return Counting(), NoComm()


def _count_collectives(layer, group, x, gy):
    group.sizes.clear()
    y = layer(x)
    forward = list(group.sizes)
    y.backward(gy)
    backward = group.sizes[len(forward) :]
    return {
        "collectives_forward": len(forward),
        "collectives_backward": len(backward),
        "floats_forward": forward,
        "floats_backward": backward,
    }


def _time_calls(dist, calls, number, repeat):
    for run in calls.values():  # warm-up
        run()
    times = {name: [] for name in calls}
    for _ in range(repeat):
        for name, run in calls.items():
            dist.barrier()
            times[name].append(timeit.Timer(run).timeit(number) / number)
    return {name: statistics.median(t) * 1000.0 for name, t in times.items()}


def _max_abs_diff(a, b, x, gy):
    """How far two layers' outputs and input gradients lie apart, from equal weights."""
    b.load_state_dict(a.state_dict())
    out = []
    for layer in (a, b):
        x.grad = None
        y = layer(x)
        y.backward(gy)
        out.append((y.detach(), x.grad.clone()))
    return max(float((p - q).abs().max()) for p, q in zip(*out))


def _one_shape(torch, dist, shape, args):
    import torch.nn as nn
    from torch_sync_bn import TorchAlgorithmSyncBN

    from mmgcu.model.sync_bn import GCUSyncBatchNorm

    channels = shape[1]
    x = torch.randn(shape).requires_grad_()
    gy = torch.randn(shape)
    group, no_comm = _groups(dist)
    layers = {
        "bn": nn.BatchNorm2d(channels),
        "gcu_sync_bn": GCUSyncBatchNorm(channels, card_group=group),
        "torch_sync_bn": TorchAlgorithmSyncBN(channels),
        "gcu_sync_bn_local": GCUSyncBatchNorm(channels, card_group=no_comm),
    }
    for layer in layers.values():
        with torch.no_grad():  # equal on every rank: the seed below is per rank
            layer.weight.copy_(torch.linspace(0.5, 1.5, channels))
            layer.bias.copy_(torch.linspace(-0.1, 0.1, channels))
    diff = _max_abs_diff(layers["gcu_sync_bn"], layers["torch_sync_bn"], x, gy)
    packed = torch.zeros(2 * channels + 1)
    calls = {name: _train_step(layer, x, gy) for name, layer in layers.items()}
    calls["all_reduce"] = functools.partial(dist.all_reduce, packed)
    collectives = _count_collectives(layers["gcu_sync_bn"], group, x, gy)
    out = _time_calls(dist, calls, args.number, args.repeat)
    out["collectives"] = collectives
    out["max_abs_diff_vs_torch"] = diff
    return out


def _rank_main(args):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    out = {}
    for spec in args.shapes.split(","):
        out[spec] = _one_shape(torch, dist, tuple(int(s) for s in spec.split("x")), args)
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps(out), flush=True)
    # No interpreter teardown: PyTorch's autograd worker thread may still be releasing its
    # last graph task, and Python 3.11 finalizing meanwhile aborts the process ("terminate
    # called without an active exception").
    os._exit(0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--number", type=int, default=20, help="calls per timing")
    p.add_argument("--repeat", type=int, default=5, help="timings per variant (median)")
    p.add_argument("--threads", type=int, default=1, help="OMP/MKL threads per rank")
    p.add_argument("--shapes", default=",".join(_name(s) for s in DEFAULT_SHAPES))
    p.add_argument("--rank-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank_child:
        _rank_main(args)
        return
    shapes = [tuple(int(s) for s in spec.split("x")) for spec in args.shapes.split(",")]
    result = measure(shapes, args.world_size, args.number, args.repeat, args.threads)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
