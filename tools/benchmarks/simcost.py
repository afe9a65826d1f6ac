"""Child of bench.py: what one simulated card costs against the plain CPU, in one process.

Run with ``MMGCU_SIMULATE=1`` (``MMGCU_SIMULATE_API=gcu2|gcu1``). It builds the tiny
config's model (an mmseg EncoderDecoder, SyncBN reverted to BN as GCURunner does for one
process) twice from the same weights, one on the CPU and one on card 0, and times with
:mod:`timeit`:

- a training step (data preprocessor, forward, backward, SGD step) on the same batch,
  the median of ``--steps`` timed steps per device, CPU and card steps interleaved;
- single ops on small tensors (``a + b`` on 64x64, ...), giving the simulator's
  per-op overhead in microseconds (median of ``--op-repeat`` timings of
  ``--op-number`` calls each).

A simulated card runs every op with the CPU kernel behind a dispatch fallback, so its
times say what a rehearsal costs, never how fast a GCU is. Prints one JSON line.
"""

import argparse
import copy
import functools
import json
import os
import statistics
import sys
import timeit

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "configs", "tiny", "fcn_r18-tiny_8xgcu_synthetic-64x64.py")

# name -> statement over float32 tensors on the device: a, b 64x64; x 1x16x32x32; w 16x16x3x3.
OPS = {
    "add 64x64": "a + b",
    "mul_ 64x64 (in place)": "a.mul_(1.0)",
    "matmul 64x64": "a @ b",
    "relu 64x64": "torch.relu(a)",
    "sum 64x64": "a.sum()",
    "conv2d 1x16x32x32, 3x3": "F.conv2d(x, w, padding=1)",
}


def _tensors(torch, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(64, 64, generator=g)
    b = torch.rand(64, 64, generator=g)
    x = torch.rand(1, 16, 32, 32, generator=g)
    w = torch.rand(16, 16, 3, 3, generator=g)
    return {k: v.to(device) for k, v in dict(a=a, b=b, x=x, w=w).items()}


def _batch(torch, size, n, seed=0):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    g = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for _ in range(n):
        inputs.append(torch.randint(0, 256, (3, size, size), generator=g, dtype=torch.uint8))
        sample = SegDataSample()
        label = torch.randint(0, 4, (1, size, size), generator=g, dtype=torch.int64)
        sample.gt_sem_seg = PixelData(data=label)
        sample.set_metainfo(dict(img_shape=(size, size), ori_shape=(size, size)))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def _parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per device")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per device first")
    parser.add_argument("--op-number", type=int, default=2000, help="op calls per timing")
    parser.add_argument("--op-repeat", type=int, default=5, help="timings per op (median)")
    parser.add_argument("--size", type=int, default=64, help="image side of the batch")
    parser.add_argument("--batch", type=int, default=2, help="images per step (config: 2)")
    return parser.parse_args()


def _model(torch):
    """The tiny config's model, SyncBN reverted to BN, weights initialised (seed 0)."""
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules

    register_all_modules()
    torch.manual_seed(0)
    model = revert_sync_batchnorm(MODELS.build(Config.fromfile(TINY).model))
    model.init_weights()
    return model


def _time_steps(torch, model, data, devices, args, result):
    """Per device: the first step's loss, warm-up steps, then interleaved timed steps."""
    from mmengine.optim import OptimWrapper

    steps = {}
    for name, device in devices:
        m = copy.deepcopy(model).to(device).train()
        wrapper = OptimWrapper(torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9))
        steps[name] = functools.partial(m.train_step, data, wrapper)
        torch.manual_seed(0)  # the same dropout draws on both
        result["first_loss"][name] = float(steps[name]()["loss"].detach())
        for _ in range(args.warmup - 1):
            steps[name]()
    # Interleaved (CPU, card, CPU, card, ...), so a change of machine load hits both.
    result["steps"] = {name: [] for name, _ in devices}
    for _ in range(args.steps):
        for name, _ in devices:
            result["steps"][name].append(timeit.Timer(steps[name]).timeit(number=1))
    cpu, gcu = (statistics.median(result["steps"][k]) for k, _ in devices)
    result["step_median_s"] = dict(cpu=cpu, card=gcu, ratio=gcu / cpu)


def _time_op(torch, F, stmt, devices, args):
    timers = {}
    for name, device in devices:
        env = dict(torch=torch, F=F, **_tensors(torch, device))
        timers[name] = timeit.Timer(stmt, globals=env)
        timers[name].timeit(number=max(1, args.op_number // 10))  # warm-up
    per_op = {name: [] for name in timers}
    for _ in range(args.op_repeat):
        for name, timer in timers.items():
            per_op[name].append(timer.timeit(number=args.op_number) / args.op_number * 1e6)
    row = {f"{name}_us": statistics.median(v) for name, v in per_op.items()}
    row["overhead_us"] = row["card_us"] - row["cpu_us"]
    row["ratio"] = row["card_us"] / row["cpu_us"]
    return row


def main() -> None:
    args = _parse_args()

    import mmgcu  # installs the simulated torch_gcu first

    if not mmgcu.sim.is_installed():
        sys.exit("simcost.py needs MMGCU_SIMULATE=1")
    import torch
    import torch.nn.functional as F

    card = mmgcu.select_accelerator("auto").device(0)
    model = _model(torch)
    data = _batch(torch, args.size, args.batch)
    result = dict(api=mmgcu.sim.state.api, card=str(card), steps={}, first_loss={}, ops={})
    devices = (("cpu", torch.device("cpu")), ("card", card))
    _time_steps(torch, model, data, devices, args, result)
    for op, stmt in OPS.items():
        result["ops"][op] = _time_op(torch, F, stmt, devices, args)
    result["torch_version"] = torch.__version__
    print(json.dumps(result))


if __name__ == "__main__":
    main()
