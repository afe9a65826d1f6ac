"""One rank of ``mmgcu check``, started by torchrun (``-m mmgcu.cli.check_worker``).

It does what a training job does first, through mmgcu only: take the rank's card and
create the process group (:func:`mmgcu.runtime.dist.init_distributed`), run collectives on card
tensors and on CPU objects, then train a small deterministic model with
:class:`~mmgcu.model.GCUDistributedDataParallel`. Rank 0 trains the same steps on one card
over the whole batch; a mean loss makes both equal up to float error, so any difference
means gradients were not averaged across cards.

Progress and the result go to ``<out>/rank<N>.json`` (rewritten atomically at each
phase), so the launcher can tell which rank failed or stopped answering without reading
logs. The top-level imports are the standard library only: the launcher imports this
module for :func:`read_results`.
"""

import argparse
import os
import sys
import time
import traceback
from collections import OrderedDict
from typing import Dict, List, Optional

from ..runtime.files import rank_file, read_rank_files, write_json_atomically

#: The phases a rank reports, in order.
PHASES = ("start", "init", "collectives", "ddp", "done")
SEED = 2024
TOLERANCE = 1e-5
FEATURES, HIDDEN, OUTPUTS, ROWS_PER_RANK = 8, 16, 4, 4


class CheckFailed(Exception):
    """A result that is wrong (as opposed to a crash): the message names the op and ranks."""


class Report:
    """This rank's JSON file: phase, pid (so the launcher can clean up) and the outcome."""

    def __init__(self, out: str, rank: int):
        self.path = rank_file(out, rank)
        self.data = {"rank": rank, "pid": os.getpid(), "ok": None}

    def update(self, **values) -> None:
        self.data.update(values, time=time.time())
        write_json_atomically(self.path, self.data, durable=False)


def read_results(out: str) -> Dict[int, dict]:
    """The latest report of every rank that wrote one, by rank."""
    return read_rank_files(out)


def check_collectives(card_dist, dist, device, group, rank: int, world: int) -> None:
    """all_reduce, broadcast and all_gather on card tensors; all_gather_object on CPU.

    ``card_dist`` and ``group`` carry card tensors (torch_gcu 1.x: torch_gcu.distributed,
    a world of its own); ``dist`` is torch.distributed, whose default group carries the
    CPU objects. Every rank checks its own values, then the ranks swap their findings with
    all_gather_object, so each one can name every rank that got a wrong value.
    """
    wrong = _card_collectives(card_dist, device, group, rank, world)
    found = [None] * world  # type: List[Optional[dict]]
    dist.all_gather_object(found, {"rank": rank, "device": str(device), "wrong": wrong})
    misplaced = [i for i, o in enumerate(found) if not isinstance(o, dict) or o["rank"] != i]
    if misplaced:
        raise CheckFailed(
            f"all_gather_object returned wrong objects in slot(s) {misplaced} on rank {rank}: "
            "the default (CPU) group mixes up ranks"
        )
    by_op = OrderedDict()  # type: Dict[str, List[str]]
    for o in found:
        for op, detail in o["wrong"]:
            by_op.setdefault(op, []).append(detail)
    for op, details in by_op.items():
        ranks = ",".join(d.split()[1] for d in details)
        raise CheckFailed(
            f"{op} on {device.type} cards gave wrong values on rank(s) {ranks} of {world}: "
            f"{details[0]}. The card collectives are broken: check ECCL ('mmgcu env') "
            "and the ECCL_* variables."
        )


def _card_collectives(card_dist, device, group, rank: int, world: int) -> List[List[str]]:
    """Run each card collective and return what this rank got wrong ([op, detail])."""
    import torch

    wrong = []  # type: List[List[str]]

    def expect(op: str, tensor, value: float) -> None:
        if tensor.device != device:
            wrong.append([op, f"rank {rank} got its result on {tensor.device}, not {device}"])
            return
        got = tensor.cpu()
        if not torch.allclose(got, torch.full_like(got, value)):
            wrong.append([op, f"rank {rank} got {got.tolist()}, expected {value}"])

    t = torch.full((4,), float(rank + 1), device=device)
    card_dist.all_reduce(t, group=group)
    expect("all_reduce(sum)", t, world * (world + 1) / 2)
    src = world - 1  # a root other than rank 0, where there is one
    t = torch.full((4,), float(rank + 1 if rank == src else -1), device=device)
    card_dist.broadcast(t, src=src, group=group)
    expect(f"broadcast(from rank {src})", t, float(src + 1))
    outs = [torch.zeros(4, device=device) for _ in range(world)]
    card_dist.all_gather(outs, torch.full((4,), float(rank + 1), device=device), group=group)
    for i, o in enumerate(outs):
        expect(f"all_gather(slot {i})", o, float(i + 1))
    return wrong


def _toy_model(torch):
    torch.manual_seed(SEED)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUTPUTS)
    )


def _train(torch, accelerator, model, x, y, steps: int) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        accelerator.optimizer_step(optimizer, model=model, loss=loss)


def _flat(torch, model):
    return torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])


def _ddp(accelerator, model):
    """The accelerator's DDP wrapper around ``model``, as ``GCURunner.wrap_model`` builds it.

    The model has no buffers, so no buffer-sync option is passed (torch >= 2.13 warns about
    ``broadcast_buffers``).
    """
    from mmengine.model import MMDistributedDataParallel

    from .. import model as _  # noqa: F401  (registers the wrappers)
    from ..counterparts import replacement_of

    (wrapper,) = [w for w in replacement_of(MMDistributedDataParallel) if w.fits(accelerator)]
    return wrapper(model, accelerator=accelerator)


def check_ddp(dist, accelerator, device, rank: int, world: int, steps: int) -> Optional[float]:
    """Train ``steps`` DDP steps on this rank's shard; rank 0 returns the max difference.

    The weights of every rank are compared with the same steps on one card (rank 0's)
    over the whole batch, and every parameter must still be on this rank's card.
    """
    import copy

    import torch

    from ..model.placement import misplaced, misplaced_message

    model = _toy_model(torch)
    single = copy.deepcopy(model) if rank == 0 else None
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(ROWS_PER_RANK * world, FEATURES, generator=gen)
    y = torch.randn(ROWS_PER_RANK * world, OUTPUTS, generator=gen)
    shard = slice(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK)

    ddp = _ddp(accelerator, model.to(device))
    _train(torch, accelerator, ddp, x[shard].to(device), y[shard].to(device), steps)
    wrong = misplaced(ddp.module, device)
    if wrong:
        raise CheckFailed(
            f"after {steps} DDP steps, " + misplaced_message(f"rank {rank}", device, wrong)
        )
    weights = [None] * world
    dist.all_gather_object(weights, _flat(torch, ddp.module))
    if rank != 0:
        return None
    single = single.to(device)
    _train(torch, accelerator, single, x.to(device), y.to(device), steps)
    return _compare(_flat(torch, single), weights, steps)


def _compare(reference, weights, steps: int) -> float:
    """The largest difference of any rank's weights from one card's; refuses a rank over
    :data:`TOLERANCE`."""
    diffs = [float((w - reference).abs().max()) for w in weights]
    bad = [str(r) for r, d in enumerate(diffs) if not d <= TOLERANCE]
    if bad:
        raise CheckFailed(
            f"after {steps} DDP steps the weights of rank(s) {','.join(bad)} differ from "
            f"the same steps on one card by up to {max(diffs):.2e} (tolerance "
            f"{TOLERANCE:g}): DDP does not train like one card (are gradients averaged "
            "across cards?). Check the process-group backend and ECCL with 'mmgcu env'."
        )
    return max(diffs)


def run_checks(args, report: Report) -> dict:
    """Card, groups, collectives, DDP; returns what the launcher's summary line needs."""
    import torch.distributed as dist

    from .. import sim
    from ..device import select_accelerator
    from ..runtime.dist import init_distributed

    rank, world = dist_env()
    accelerator = select_accelerator(args.device)
    report.update(phase="init", generation=accelerator.kind)
    card = init_distributed(accelerator, "pytorch", timeout=args.timeout)
    device = accelerator.device(card)
    report.update(phase="collectives", device=str(device))
    group = accelerator.card_group
    check_collectives(group.dist, dist, device, group.group, rank, world)
    report.update(phase="ddp")
    max_diff = check_ddp(dist, accelerator, device, rank, world, args.steps)
    return dict(
        max_diff=max_diff,
        is_gcu=accelerator.is_gcu,
        device_type=accelerator.device_type,
        dist_backend=accelerator.summary()["process_groups"],
        simulated=sim.is_installed(),
    )


def dist_env():
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmgcu.cli.check_worker")
    parser.add_argument("--out", required=True, help="folder for rank<N>.json")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)

    from ..errors import GCUError

    report = Report(args.out, dist_env()[0])
    report.update(phase="start")
    code = 1
    try:
        report.update(ok=True, phase="done", **run_checks(args, report))
        code = 0
    except CheckFailed as e:
        report.update(ok=False, kind="check", error=str(e))
    except GCUError as e:  # mmgcu's own messages name the fix: pass them through
        report.update(ok=False, kind="setup", error=str(e))
    except Exception as e:
        traceback.print_exc()
        report.update(ok=False, kind="crash", error=f"{type(e).__name__}: {e}")
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
