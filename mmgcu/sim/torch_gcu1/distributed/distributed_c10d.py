"""Models torch_gcu/distributed/distributed_c10d.py of a 1.x release.

torch_gcu 1.x ships its own copy of c10d, separate from torch.distributed: its own
``Backend``, ``ReduceOp``, group registry and ``group.WORLD``. It knows one backend,
``'eccl'`` (anything else: "only support eccl"), and has no object collectives
(``broadcast_object_list``, ``all_gather_object``, ``gather_object``). ECCL is not a
torch.distributed backend. Each ECCL group is bound to the card of ``LOCAL_RANK``.

The simulated ECCL runs each collective through gloo on the cards' host memory.
"""

import atexit
import datetime
import enum
import os
import weakref
from typing import Dict, Optional

import torch
import torch.distributed as _c10d  # the simulator's wire only
from torch.distributed.constants import default_pg_timeout  # as in the 1.x source

from ... import eccl_installed, state, wire
from .rendezvous import register_rendezvous_handler, rendezvous  # noqa: F401 (exported)


class Backend:
    UNDEFINED = "undefined"
    ECCL = "eccl"

    def __new__(cls, name: str):
        if not isinstance(name, str):
            raise ValueError(f"Backend name must be a string, but got: {name}")
        return getattr(Backend, name.upper(), Backend.UNDEFINED)


class ReduceOp(enum.Enum):
    """torch_gcu's own reduce ops (torch.distributed's are another type)."""

    SUM = "SUM"
    PRODUCT = "PRODUCT"
    MIN = "MIN"
    MAX = "MAX"


class _Work:
    def __init__(self, result):
        self._result = result

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def result(self):
        return self._result


class ProcessGroupECCL:
    """An ECCL communicator of one card: card tensors only (simulated over gloo)."""

    def __init__(self, store, local_rank: int, rank: int, size: int, timeout):
        self._card = local_rank
        self._gloo = _c10d.ProcessGroupGloo(store, rank, size, timeout)
        # A gloo group left to interpreter teardown can abort the process; a real ECCL
        # exits cleanly, so release gloo while Python is still whole.
        atexit.register(_release, weakref.ref(self))

    def rank(self) -> int:
        return self._gloo.rank()

    def size(self) -> int:
        return self._gloo.size()

    def _host(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type != "xla":
            raise RuntimeError(f"ECCL carries only GCU tensors, got a tensor on {tensor.device}")
        if tensor.device.index != self._card:
            raise RuntimeError(
                f"the ECCL communicator of card {self._card} got a tensor on {tensor.device}"
            )
        return state.ext.host_alias(tensor)

    def _run(self, method: str, *args):
        getattr(self._gloo, method)(*args).wait()

    @staticmethod
    def _in_graph(name: str, inputs, outputs=None) -> None:
        """The collective as an op of the card's lazy graph (mmgcu.sim.graph): no cut, as
        torch_xla's all_reduce. ASSUMED for ECCL: the 1.x source shows its Python layer only."""
        inputs = list(inputs)
        state.ext.graph_collective(name, inputs, inputs if outputs is None else list(outputs))

    def allreduce(self, tensors, op: ReduceOp):
        hosts = [self._host(t) for t in tensors]
        self._in_graph(f"allreduce.{op.name}", tensors)
        if op is ReduceOp.SUM and wire.gathered_sum(self._gloo, hosts):
            return _Work(tensors)
        opts = _c10d.AllreduceOptions()
        opts.reduceOp = getattr(_c10d.ReduceOp, op.name)
        self._run("allreduce", hosts, opts)
        return _Work(tensors)

    def broadcast(self, tensors, root: int):
        opts = _c10d.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        self._in_graph("broadcast", tensors)
        self._run("broadcast", [self._host(t) for t in tensors], opts)
        return _Work(tensors)

    def allgather(self, output_lists, inputs):
        outs = [[self._host(t) for t in out] for out in output_lists]
        self._in_graph("allgather", inputs, [t for out in output_lists for t in out])
        self._run("allgather", outs, [self._host(t) for t in inputs])
        return _Work(output_lists)

    def barrier(self):
        self._run("barrier")
        return _Work([])


def _release(ref) -> None:
    group = ref()
    gloo = getattr(group, "_gloo", None)
    if gloo is not None and hasattr(gloo, "shutdown"):
        group._gloo = None
        gloo.shutdown()


class group:
    WORLD: Optional[ProcessGroupECCL] = None


class GroupMember:
    WORLD = None
    NON_GROUP_MEMBER = object()


_pg_map: Dict[ProcessGroupECCL, tuple] = {}
_pg_names: Dict[ProcessGroupECCL, str] = {}
_pg_group_ranks: Dict[ProcessGroupECCL, Dict[int, int]] = {}
_group_count = 0


def is_available() -> bool:
    return True


def is_eccl_available() -> bool:
    return eccl_installed()


def is_initialized() -> bool:
    return group.WORLD is not None


def _set_world(pg) -> None:
    group.WORLD = GroupMember.WORLD = pg


def _get_default_group() -> ProcessGroupECCL:
    if not is_initialized():
        raise RuntimeError(
            "Default process group has not been initialized, "
            "please make sure to call init_process_group."
        )
    return group.WORLD


def _new_process_group_helper(world_size, rank, ranks, backend, store, group_name, timeout):
    global _group_count
    if not group_name:
        group_name = str(_group_count)
        _group_count += 1
    if group_name in _pg_names.values():
        raise RuntimeError(
            "The specified group name has already been created, please use a different group name"
        )
    if Backend(backend) != Backend.ECCL:
        raise RuntimeError("only support eccl")
    if not is_eccl_available():
        raise RuntimeError("Distributed package doesn't have ECCL built in")
    if ranks and _get_default_group().rank() not in ranks:
        return GroupMember.NON_GROUP_MEMBER
    local_rank = int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else rank
    prefix_store = _c10d.PrefixStore(group_name, store)
    pg = ProcessGroupECCL(prefix_store, local_rank, rank, world_size, timeout)
    _pg_map[pg] = (Backend.ECCL, store)
    _pg_names[pg] = group_name
    return pg


def init_process_group(
    backend,
    init_method=None,
    timeout=default_pg_timeout,
    world_size=-1,
    rank=-1,
    store=None,
    group_name="",
    pg_options=None,
):
    """The default ECCL group of torch_gcu's own world (``store`` must be torch_gcu's)."""
    if not isinstance(timeout, datetime.timedelta):
        raise RuntimeError("Expected timeout argument to be of typedatetime.timedelta")
    if group.WORLD is not None:
        raise RuntimeError("trying to initialize the default process group twice!")
    assert (store is None) or (init_method is None), "Cannot specify both init_method and store."
    if store is not None:
        # Its stores are torch_gcu's own C++ classes; a torch.distributed store is another type.
        raise TypeError("init_process_group(): store must be a torch_gcu store")
    store, rank, world_size = next(
        rendezvous(init_method or "env://", rank, world_size, timeout=timeout)
    )
    store.set_timeout(timeout)
    store = _c10d.PrefixStore("default_pg", store)
    pg = _new_process_group_helper(world_size, rank, [], backend, store, group_name, timeout)
    _set_world(pg)
    _pg_group_ranks[pg] = {i: i for i in range(pg.size())}
    barrier()


def new_group(ranks=None, timeout=default_pg_timeout, backend=None, pg_options=None):
    default_pg = _get_default_group()
    default_backend, default_store = _pg_map[default_pg]
    ranks = sorted(ranks) if ranks is not None else list(range(default_pg.size()))
    me = default_pg.rank()
    pg = _new_process_group_helper(
        len(ranks),
        ranks.index(me) if me in ranks else -1,
        ranks,
        backend or default_backend,
        default_store,
        None,
        timeout,
    )
    _pg_group_ranks[pg] = {g: r for r, g in enumerate(ranks)}
    barrier()
    return pg


def destroy_process_group(group=None) -> None:  # noqa: A002
    global _group_count
    if group is None or group is GroupMember.WORLD:
        _set_world(None)
        _pg_map.clear()
        _pg_names.clear()
        _pg_group_ranks.clear()
        _group_count = 0
    else:
        for registry in (_pg_map, _pg_names, _pg_group_ranks):
            registry.pop(group, None)


def _group(group_or_none):
    if group_or_none is GroupMember.NON_GROUP_MEMBER:
        return None
    return _get_default_group() if group_or_none is None else group_or_none


def get_rank(group=None) -> int:  # noqa: A002
    pg = _group(group)
    return -1 if pg is None else pg.rank()


def get_world_size(group=None) -> int:  # noqa: A002
    pg = _group(group)
    return -1 if pg is None else pg.size()


def get_local_rank() -> int:
    return int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else get_rank()


def get_backend(group=None) -> str:  # noqa: A002
    return _pg_map[_group(group)][0]


def _finish(work, async_op):
    if async_op:
        return work
    work.wait()
    return None


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):  # noqa: A002
    if not isinstance(op, ReduceOp):
        raise TypeError(f"all_reduce(): op must be a torch_gcu.distributed.ReduceOp, got {op!r}")
    pg = _group(group)
    if pg is None:
        return None
    return _finish(pg.allreduce([tensor], op), async_op)


def broadcast(tensor, src, group=None, async_op=False):  # noqa: A002
    pg = _group(group)
    if pg is None:
        return None
    root = 0 if src == -1 else src  # -1: DDP's "the group's first rank"
    if group is not None and src != -1:
        root = _pg_group_ranks[pg][src]
    return _finish(pg.broadcast([tensor], root), async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):  # noqa: A002
    pg = _group(group)
    if pg is None:
        return None
    return _finish(pg.allgather([tensor_list], [tensor]), async_op)


def barrier(group=None, async_op=False, device_ids=None):  # noqa: A002
    pg = _group(group)
    if pg is None:
        return None
    return _finish(pg.barrier(), async_op)
