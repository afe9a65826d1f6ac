"""One rank of N on simulated T20 cards: model code's torch.distributed collectives on card
tensors, routed by mmgcu's gloo_eccl default group, against the same calls on CPU tensors.

Run as rank RANK of WORLD_SIZE (LOCAL_RANK, MASTER_ADDR, MASTER_PORT set) with
``MMGCU_SIMULATE=t20``. The groups are made as GCURunner makes them
(``mmgcu.runtime.dist.init_distributed``: gloo_eccl, then torch_gcu.distributed's ECCL
world). Each case runs one call on CPU tensors and on this rank's card with the same
values, and reports whether the card's result has the CPU's bytes (dtype, shape and
contents). The values are small integers and halves, exact in any order of summation, so
gloo's ring and ECCL's order agree to the bit. Where torch 1.10's gloo lacks the call
(``all_gather_into_tensor``, ``reduce_scatter``, ``reduce_scatter_tensor``, ``all_to_all``),
the CPU result is made from calls it has (``all_gather``, ``all_reduce``,
``all_to_all_single``), named under ``reference``. Prints one JSON line.
"""

import json
import logging

import torch
import torch.distributed as dist

import mmgcu  # noqa: F401  (installs the simulated torch_gcu)
from mmgcu.device import select_accelerator
from mmgcu.runtime.dist import init_distributed
from mmgcu.sim import state

CASES = []


def case(fn):
    CASES.append(fn)
    return fn


class Context:
    """The rank, its card and the world; ``run(call)`` runs ``call(device)`` on the CPU and
    on the card and returns the two results (tensors or lists of them), on the CPU."""

    def __init__(self, accelerator, card):
        self.accelerator = accelerator
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.card = accelerator.device(card)
        self.torch_1 = torch.__version__.startswith("1.")

    def values(self, *shape, dtype=torch.float32, seed=0):
        """This rank's values: small integers and halves (exact sums in any order)."""
        n = 1
        for size in shape:
            n *= size
        flat = (torch.arange(n) * (self.rank + 1 + seed) % 7).to(torch.float32)
        flat = flat + 0.5 * ((self.rank + seed) % 2)
        return flat.reshape(shape).to(dtype)

    def run(self, call, reference=None):
        cpu = (reference or call)(torch.device("cpu"))
        card = call(self.card)
        return cpu, card


def as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def same_bytes(cpu, card, card_type="xla") -> bool:
    """Whether ``card`` (on the card) holds the bytes of ``cpu``, tensor by tensor."""
    cpu, card = as_list(cpu), as_list(card)
    if len(cpu) != len(card):
        return False
    for a, b in zip(cpu, card):
        if b.device.type != card_type or a.device.type != "cpu":
            return False
        b = b.cpu()
        if (a.dtype, a.shape) != (b.dtype, b.shape):
            return False
        if a.numpy().tobytes() != b.numpy().tobytes():
            return False
    return True


def cpu_lacks(name: str) -> bool:
    """Whether this torch's gloo lacks ``name`` (torch 1.10's: the calls below)."""
    return torch.__version__.startswith("1.") and name in (
        "all_gather_into_tensor",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_to_all",
    )


# -- all_reduce ------------------------------------------------------------------------------
def _all_reduce(ctx, op_name, dtype=torch.float32, async_op=False):
    op = getattr(dist.ReduceOp, op_name)

    def call(device):
        t = ctx.values(3, 5, dtype=dtype).to(device)
        if op_name == "PRODUCT":
            t = t % 3 + 1  # small products stay exact
        work = dist.all_reduce(t, op=op, async_op=async_op)
        if async_op:
            work.wait()
        return t

    return call


@case
def all_reduce(ctx):
    found = {}
    ops = ["SUM", "MAX", "MIN", "PRODUCT"] + (["AVG"] if hasattr(dist.ReduceOp, "AVG") else [])
    for name in ops:
        found[f"all_reduce {name}"] = same_bytes(*ctx.run(_all_reduce(ctx, name)))
    found["all_reduce SUM int32"] = same_bytes(*ctx.run(_all_reduce(ctx, "SUM", torch.int32)))
    found["all_reduce SUM float16"] = same_bytes(*ctx.run(_all_reduce(ctx, "SUM", torch.float16)))
    found["all_reduce SUM async_op"] = same_bytes(*ctx.run(_all_reduce(ctx, "SUM", async_op=True)))
    found["all_reduce MAX async_op"] = same_bytes(*ctx.run(_all_reduce(ctx, "MAX", async_op=True)))
    return found


@case
def all_reduce_of_a_view(ctx):
    def call(device):
        base = torch.zeros(4, 6).to(device)
        view = base[1:3]  # in place, under the view
        view.copy_(ctx.values(2, 6).to(device))
        dist.all_reduce(view)
        return base

    return {"all_reduce of a view": same_bytes(*ctx.run(call))}


# -- broadcast, reduce -------------------------------------------------------------------------
@case
def broadcast(ctx):
    found = {}
    for async_op in (False, True):

        def call(device, async_op=async_op):
            t = ctx.values(4, 3).to(device)
            work = dist.broadcast(t, src=ctx.world - 1, async_op=async_op)
            if async_op:
                work.wait()
            return t

        found[f"broadcast{' async_op' if async_op else ''}"] = same_bytes(*ctx.run(call))
    return found


@case
def reduce(ctx):
    def call(device):
        t = ctx.values(6).to(device)
        dist.reduce(t, dst=0)
        return t

    cpu, card = ctx.run(call)
    # Only dst's tensor is defined by torch; every rank's is compared all the same.
    return {"reduce": same_bytes(cpu, card)}


# -- all_gather -------------------------------------------------------------------------------
@case
def all_gather(ctx):
    found = {}
    for async_op in (False, True):

        def call(device, async_op=async_op):
            out = [torch.zeros(2, 3).to(device) for _ in range(ctx.world)]
            work = dist.all_gather(out, ctx.values(2, 3).to(device), async_op=async_op)
            if async_op:
                work.wait()
            return out

        found[f"all_gather{' async_op' if async_op else ''}"] = same_bytes(*ctx.run(call))
    return found


def _gather_into_tensor():
    return getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base


@case
def all_gather_into_tensor(ctx):
    def call(device):
        out = torch.zeros(ctx.world * 2, 3).to(device)
        _gather_into_tensor()(out, ctx.values(2, 3).to(device))
        return out

    def reference(device):
        parts = [torch.zeros(2, 3) for _ in range(ctx.world)]
        dist.all_gather(parts, ctx.values(2, 3))
        return torch.cat(parts)

    lacks = cpu_lacks("all_gather_into_tensor")
    return {
        "all_gather_into_tensor": same_bytes(*ctx.run(call, reference if lacks else None)),
        "reference all_gather_into_tensor": "all_gather" if lacks else "same call",
    }


# -- reduce_scatter ----------------------------------------------------------------------------
@case
def reduce_scatter(ctx):
    def call(device):
        out = torch.zeros(4).to(device)
        parts = [ctx.values(4, seed=i).to(device) for i in range(ctx.world)]
        dist.reduce_scatter(out, parts)
        return out

    def reference(device):
        parts = torch.stack([ctx.values(4, seed=i) for i in range(ctx.world)])
        dist.all_reduce(parts)
        return parts[ctx.rank].clone()

    lacks = cpu_lacks("reduce_scatter")
    return {
        "reduce_scatter": same_bytes(*ctx.run(call, reference if lacks else None)),
        "reference reduce_scatter": "all_reduce" if lacks else "same call",
    }


def _scatter_tensor():
    return getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base


@case
def reduce_scatter_tensor(ctx):
    def call(device):
        out = torch.zeros(2, 3).to(device)
        _scatter_tensor()(out, ctx.values(ctx.world * 2, 3).to(device))
        return out

    def reference(device):
        whole = ctx.values(ctx.world * 2, 3)
        dist.all_reduce(whole)
        return whole[2 * ctx.rank : 2 * ctx.rank + 2].clone()

    lacks = cpu_lacks("reduce_scatter_tensor")
    return {
        "reduce_scatter_tensor": same_bytes(*ctx.run(call, reference if lacks else None)),
        "reference reduce_scatter_tensor": "all_reduce" if lacks else "same call",
    }


# -- all_to_all ------------------------------------------------------------------------------
@case
def all_to_all(ctx):
    def single(device):
        out = torch.zeros(ctx.world * 2).to(device)
        dist.all_to_all_single(out, ctx.values(ctx.world * 2).to(device))
        return out

    def lists(device):
        outs = [torch.zeros(2).to(device) for _ in range(ctx.world)]
        dist.all_to_all(outs, list(ctx.values(ctx.world * 2).to(device).split(2)))
        return outs

    def reference(device):
        return list(single(device).split(2))

    lacks = cpu_lacks("all_to_all")
    return {
        "all_to_all_single": same_bytes(*ctx.run(single)),
        "all_to_all": same_bytes(*ctx.run(lists, reference if lacks else None)),
        "reference all_to_all": "all_to_all_single" if lacks else "same call",
    }


# -- calls ECCL lacks: through the CPU -------------------------------------------------------
@case
def gather_and_scatter(ctx):
    def gather(device):
        out = [torch.zeros(3).to(device) for _ in range(ctx.world)] if ctx.rank == 0 else None
        dist.gather(ctx.values(3).to(device), out, dst=0)
        return out or []

    def scatter(device):
        out = torch.zeros(3).to(device)
        parts = [ctx.values(3, seed=i).to(device) for i in range(ctx.world)]
        dist.scatter(out, parts if ctx.rank == 0 else None, src=0)
        return out

    return {
        "gather": same_bytes(*ctx.run(gather)),
        "scatter": same_bytes(*ctx.run(scatter)),
    }


# -- order: the ECCL calls issued are launched before the host waits ----------------------------
@case
def barrier_launches_the_issued_calls(ctx):
    dist.barrier()
    before = state.counters["unlazy"]
    t = ctx.values(3).to(ctx.card)
    dist.all_reduce(t)
    dist.barrier()  # launches the graph that holds the all_reduce: one unlazy
    after_one = state.counters["unlazy"]
    dist.barrier()  # nothing issued since: nothing launched
    return {"unlazy before a barrier": [after_one - before, state.counters["unlazy"] - after_one]}


# -- groups -----------------------------------------------------------------------------------
@case
def subgroup(ctx):
    ranks = list(range(max(2, ctx.world // 2)))
    sub = dist.new_group(ranks)  # every rank makes it, as torch requires
    found = {"subgroup backend": dist.get_backend(sub) if ctx.rank in ranks else None}
    if ctx.rank in ranks:

        def call(device):
            t = ctx.values(5).to(device)
            dist.all_reduce(t, group=sub)
            dist.all_reduce(t, group=sub)  # twice: said once
            return t

        found["subgroup all_reduce"] = same_bytes(*ctx.run(call))
        found["subgroup counts"] = dict(sub.counts)
    return found


@case
def a_gloo_group_refuses_card_tensors(ctx):
    gloo = dist.new_group(backend="gloo")
    try:
        dist.all_reduce(torch.ones(2).to(ctx.card), group=gloo)
        return {"gloo group": None}
    except RuntimeError as e:
        return {"gloo group": str(e).splitlines()[0]}


@case
def mixed_devices_are_refused(ctx):
    try:
        out = [torch.zeros(2) for _ in range(ctx.world)]
        dist.all_gather(out, torch.ones(2).to(ctx.card))
        return {"mixed": None}
    except RuntimeError as e:
        return {"mixed": [type(e).__name__, str(e)]}


@case
def mmengine_objects_stay_on_gloo(ctx):
    from mmengine import dist as mdist

    world = dist.group.WORLD
    before = dict(world.counts)
    objects = [None] * ctx.world
    dist.all_gather_object(objects, {"rank": ctx.rank})
    gathered = mdist.all_gather_object(ctx.rank)
    sent = [f"from {ctx.rank}"]
    mdist.broadcast_object_list(sent, src=0)
    card = torch.full((2,), float(ctx.rank)).to(ctx.card)
    mdist.all_reduce(card)  # mmengine sends a CPU copy (comm device: the CPU)
    results = mdist.collect_results([ctx.rank], ctx.world, device="cpu")
    grew = {k: v - before.get(k, 0) for k, v in world.counts.items() if v != before.get(k, 0)}
    return {
        "mmengine": [
            objects == [{"rank": r} for r in range(ctx.world)],
            gathered == list(range(ctx.world)),
            sent == ["from 0"],
            [str(card.device), card.cpu().tolist()],
            results if ctx.rank == 0 else None,
        ],
        "mmengine routes": sorted({k.split()[1] for k in grew}),
        "comm device": str(mdist.get_comm_device()),
    }


def main() -> None:
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("mmgcu.device.gcu1_dist").addHandler(handler)

    accelerator = select_accelerator("gcu1")
    card = init_distributed(accelerator, "pytorch", timeout=120)
    ctx = Context(accelerator, card)
    out = {"rank": ctx.rank, "backend": dist.get_backend(), "card": str(ctx.card)}
    for check in CASES:
        out.update(check(ctx))
    out["counts"] = dict(dist.group.WORLD.counts)
    out["log"] = records
    print(json.dumps(out), flush=True)
    dist.barrier()
    accelerator.torch_gcu.distributed.destroy_process_group()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
