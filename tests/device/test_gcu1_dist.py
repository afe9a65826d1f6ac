"""mmgcu's gloo_eccl backend for torch_gcu 1.x: torch.distributed's groups route by device.

The first tests build groups in this process (a world of one, over gloo), with a recording
stand-in for torch_gcu.distributed and ``meta`` tensors as the cards; the last ones run
ranks on simulated T20 cards (``programs/routed_collectives.py``), made as GCURunner makes
them, and compare each call's bytes on the cards with the same call on CPU tensors.
"""

import datetime
import enum
import os
import types

import pytest
import torch
import torch.distributed as dist

from mmgcu.device import GCUError, gcu1_dist
from tests.conftest import TORCH_1
from tests.sim.helpers import run_ranks

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "routed_collectives.py")
TIMEOUT = datetime.timedelta(seconds=30)


class FakeReduceOp(enum.Enum):
    """torch_gcu's own ReduceOp: another type than torch's."""

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
    BAND = 4
    BOR = 5
    BXOR = 6


class FakeWork:
    def wait(self):
        return True


def fake_eccl(calls):
    """torch_gcu.distributed's collectives, recorded as (name, op, group, async_op)."""

    def collective(name):
        def call(*args, op=None, group=None, async_op=False):
            calls.append((name, op, group, async_op))
            return FakeWork()

        return call

    module = types.SimpleNamespace(ReduceOp=FakeReduceOp)
    for name in ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter"):
        setattr(module, name, collective(name))
    return module


@pytest.fixture
def route():
    return gcu1_dist.CardRoute("meta")  # meta tensors stand for the cards here


@pytest.fixture
def calls():
    return []


@pytest.fixture
def launched():
    return []


@pytest.fixture
def world(route, calls, launched):
    """A default group of one rank, its card tensors bound to a recording ECCL world."""
    route.bind(fake_eccl(calls), "ECCL world", launched.append)
    return gcu1_dist.RoutedGroup(dist.HashStore(), 0, 1, TIMEOUT, route, world=True)


def test_op_names():
    for name in ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
        assert gcu1_dist.op_name(getattr(dist.ReduceOp, name)) == name
    if not TORCH_1:  # torch 1.10 has no AVG
        assert gcu1_dist.op_name(dist.ReduceOp.AVG) == "AVG"
    with pytest.raises(ValueError, match="unknown"):
        gcu1_dist.op_name("SUM")


def test_the_backend_name_is_not_one_mmengine_knows():
    # mmengine's get_comm_device() maps these to a device; any other name to the CPU.
    assert gcu1_dist.BACKEND not in ("hccl", "nccl", "cncl", "smddp", "mccl", "xccl", "gloo")


def options(kind, **fields):
    """torch.distributed's options object of ``kind`` (``'Allreduce'``, ...) with ``fields``."""
    opts = getattr(dist, f"{kind}Options")()
    for name, value in fields.items():
        setattr(opts, name, value)
    return opts


def test_cpu_tensors_go_to_gloo(world, calls):
    t = torch.arange(4.0)
    world.allreduce([t], options("Allreduce")).wait()
    world.broadcast([t], options("Broadcast", rootRank=0)).wait()
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert calls == []
    assert world.counts == {"all_reduce gloo": 1, "broadcast gloo": 1}


def test_card_tensors_go_to_eccl_with_its_own_reduce_op(world, calls):
    t = torch.ones(3, device="meta")
    world.allreduce([t], options("Allreduce", reduceOp=dist.ReduceOp.MAX)).wait()
    world.reduce([t], options("Reduce", rootRank=0)).wait()
    world.broadcast([t], options("Broadcast", rootRank=0)).wait()
    assert calls == [
        ("all_reduce", FakeReduceOp.MAX, "ECCL world", True),
        ("reduce", FakeReduceOp.SUM, "ECCL world", True),
        ("broadcast", None, "ECCL world", True),
    ]
    assert world.counts == {"all_reduce eccl": 1, "reduce eccl": 1, "broadcast eccl": 1}


def test_a_mix_of_cpu_and_card_tensors_is_refused(world, calls):
    out = [torch.zeros(2)]
    with pytest.raises(GCUError) as err:
        world.allgather([out], [torch.ones(2, device="meta")])
    message = str(err.value)
    assert message.startswith("torch.distributed.all_gather was given tensors on cpu and meta")
    assert "every tensor of the call on this rank's card, or every one on the CPU" in message
    assert calls == []


@pytest.mark.skipif(TORCH_1, reason="torch 1.10 has no ReduceOp.AVG")
def test_ops_eccl_lacks_are_named():
    opts = options("Allreduce", reduceOp=dist.ReduceOp.AVG)
    assert gcu1_dist.RoutedGroup._reduce(opts, None) == (
        None,
        "torch_gcu 1.x's ECCL ReduceOp has no AVG",
    )


def test_issued_eccl_calls_are_launched_before_the_host_waits(world, launched):
    kept = torch.ones(2, device="meta")
    world.allreduce([kept], options("Allreduce"))
    world.allreduce([torch.ones(2, device="meta")], options("Allreduce"))  # freed at once
    assert launched == []  # an ECCL call waits for nothing on the host
    world.barrier().wait()
    assert len(launched) == 1 and [t is kept for t in launched[0]] == [True]
    world.barrier().wait()  # nothing issued since
    world.allreduce([torch.ones(1)], options("Allreduce")).wait()
    assert len(launched) == 1


def test_notes_of_freed_tensors_do_not_pile_up(route):
    for _ in range(3 * route.PRUNE_AT):
        route.issued([torch.ones(1, device="meta")])
    assert len(route._issued) <= route.PRUNE_AT + 1


def test_the_backend_makes_the_default_group_and_subgroups():
    route = gcu1_dist.CardRoute("xla")
    gcu1_dist.register(route)
    gcu1_dist.register(route)  # again: the same backend, this route
    dist.init_process_group(
        gcu1_dist.BACKEND, store=dist.HashStore(), rank=0, world_size=1, timeout=TIMEOUT
    )
    try:
        world = dist.group.WORLD
        sub = dist.new_group([0])
        assert isinstance(world, gcu1_dist.RoutedGroup) and world._world
        assert isinstance(sub, gcu1_dist.RoutedGroup) and not sub._world
        assert dist.get_backend() == dist.get_backend(sub) == gcu1_dist.BACKEND
        t = torch.full((2,), 3.0)
        dist.all_reduce(t)
        objects = [None]
        dist.all_gather_object(objects, {"rank": 0})
        assert (t.tolist(), objects) == ([3.0, 3.0], [{"rank": 0}])
        assert world.counts["all_reduce gloo"] == 1
        assert {key.split()[1] for key in world.counts} == {"gloo"}  # objects too
    finally:
        dist.destroy_process_group()


# -- ranks on simulated T20 cards -------------------------------------------------------------

#: Each call's bytes on the cards against the same call on CPU tensors.
SAME_BYTES = [
    "all_reduce SUM",
    "all_reduce MAX",
    "all_reduce MIN",
    "all_reduce PRODUCT",
    "all_reduce SUM int32",
    "all_reduce SUM float16",
    "all_reduce SUM async_op",
    "all_reduce MAX async_op",
    "all_reduce of a view",
    "broadcast",
    "broadcast async_op",
    "reduce",
    "all_gather",
    "all_gather async_op",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "all_to_all",
    "gather",
    "scatter",
] + ([] if TORCH_1 else ["all_reduce AVG"])
#: torch.distributed's calls on card tensors of the default group that ECCL carries, and
#: those it lacks (through the CPU).
ON_ECCL = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "all_to_all",
]
THROUGH_CPU = ["gather", "scatter"] + ([] if TORCH_1 else ["all_reduce"])  # AVG
#: The CPU results compared with: the same call, or on torch 1.10, whose gloo lacks these,
#: one made from calls it has.
REFERENCES = {
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter": "all_reduce",
    "reduce_scatter_tensor": "all_reduce",
    "all_to_all": "all_to_all_single",
}
if not TORCH_1:
    REFERENCES = dict.fromkeys(REFERENCES, "same call")


def said(reason: str, call: str = "all_reduce") -> str:
    return (
        f"mmgcu: torch.distributed.{call} of card tensors goes through the CPU and back "
        f"({reason}): a host read and a copy to the card per call"
    )


@pytest.mark.parametrize("world_size", [2, 8])
def test_card_collectives_through_torch_distributed(world_size):
    outs = run_ranks(PROGRAM, world_size=world_size, timeout=400, MMGCU_SIMULATE="t20")
    sub = list(range(max(2, world_size // 2)))
    for rank, out in enumerate(outs):
        assert (out["rank"], out["backend"], out["card"]) == (rank, "gloo_eccl", f"xla:{rank}")
        for key in SAME_BYTES:
            assert out[key] is True, (rank, key)
        references = {k.split(" ", 1)[1]: v for k, v in out.items() if k.startswith("reference ")}
        assert references == REFERENCES, rank
        for call in ON_ECCL:
            assert out["counts"].get(f"{call} eccl", 0) >= 1, (rank, call)
        for call in THROUGH_CPU:
            assert out["counts"].get(f"{call} cpu", 0) == 1, (rank, call)
        # an ECCL call, then a barrier: its graph is launched once, then nothing more
        assert out["unlazy before a barrier"] == [1, 0]
        # a subgroup's card tensors go through the CPU, said once (by its first rank)
        if rank in sub:
            assert out["subgroup backend"] == "gloo_eccl"
            assert out["subgroup all_reduce"] is True
            assert out["subgroup counts"] == {"all_reduce cpu": 2, "all_reduce gloo": 2}
        else:
            assert "subgroup all_reduce" not in out
        # a group the user made with backend='gloo' refuses card tensors, as on a T20
        assert out["gloo group"] == "ProcessGroupGloo::allreduce: unsupported device type xla"
        kind, message = out["mixed"]
        assert kind == "GCUError"
        assert message.startswith("torch.distributed.all_gather was given tensors on cpu and xla")
        # mmengine's object collectives (and its all_reduce, on a CPU copy) stay on gloo
        objects, gathered, sent, card, results = out["mmengine"]
        assert (objects, gathered, sent) == (True, True, True)
        assert card == [f"xla:{rank}", [float(sum(range(world_size)))] * 2]
        assert results == (list(range(world_size)) if rank == 0 else None)
        assert (out["mmengine routes"], out["comm device"]) == (["gloo"], "cpu")
    subgroup = said("on a subgroup: mmgcu's one ECCL group is torch_gcu.distributed's world")
    lacking = [
        said("torch_gcu 1.x's ECCL has no gather", "gather"),
        said("torch_gcu 1.x's ECCL has no scatter", "scatter"),
    ]
    avg = [] if TORCH_1 else [said("torch_gcu 1.x's ECCL ReduceOp has no AVG")]
    assert sorted(outs[0]["log"]) == sorted(avg + lacking + [subgroup])
    assert all(out["log"] == [] for out in outs[1:])  # the groups' first rank says it


def test_the_model_code_of_issue_45_reaches_eccl():
    """mmseg's EMAModule (EMANet) and, where installed, mmdet's reduce_mean (Mask2Former,
    MaskFormer) all-reduce card tensors with torch.distributed: one ECCL call each, with
    the bytes of the same code on the CPU."""
    program = os.path.join(os.path.dirname(__file__), "programs", "model_reduce_means.py")
    outs = run_ranks(program, world_size=2, timeout=300, MMGCU_SIMULATE="t20")
    for rank, out in enumerate(outs):
        assert out["EMAModule"] == [f"xla:{rank}", True], out
        assert out["EMAModule all_reduce eccl"] == 1, out
        mmdet = out["mmdet reduce_mean"]
        if isinstance(mmdet, str):  # this environment has no mmdet
            assert mmdet.startswith("not importable: No module named 'mmdet'"), mmdet
        else:
            assert mmdet == [f"xla:{rank}", True], out
            assert out["mmdet reduce_mean all_reduce eccl"] == 1, out
