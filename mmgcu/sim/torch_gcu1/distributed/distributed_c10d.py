"""Models torch_gcu/distributed/distributed_c10d.py of a 1.x release.

torch_gcu 1.x ships its own copy of c10d, separate from torch.distributed: its own
``Backend``, ``ReduceOp``, group registry and ``group.WORLD``. It knows one backend,
``'eccl'`` (anything else: "only support eccl"), and has no object collectives
(``broadcast_object_list``, ``all_gather_object``, ``gather_object``). ECCL is not a
torch.distributed backend. Each ECCL group is bound to the card of ``LOCAL_RANK``.

Its collectives, with the 1.x signatures (each takes ``async_op``): ``all_reduce``,
``broadcast``, ``reduce``, ``all_gather``, ``_all_gather_base``, ``reduce_scatter``,
``_reduce_scatter_base``, ``all_to_all``, ``all_to_all_single`` and ``barrier``. It has no
``gather``, ``scatter``, coalesced calls (``all_reduce_coalesced``,
``all_gather_coalesced``) or ``monitored_barrier``. Also in the 1.x source and not
modelled here: point-to-point calls (``send``, ``recv``, ``isend``, ``irecv``,
``batch_isend_irecv``) and torch_gcu's ``all_gatherv``.

The simulated ECCL runs each collective through gloo on the cards' host memory. Every card
collective is one method of :class:`ProcessGroupECCL`; the functions of this module only
check their arguments and call it.
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
    """torch_gcu's own reduce ops (torch.distributed's are another type): the members its
    source names (``supports_complex``). It names no ``AVG`` or ``PREMUL_SUM`` (ASSUMED
    absent: ``torch_gcu._GCUC.ReduceOp`` itself is compiled code)."""

    SUM = "SUM"
    PRODUCT = "PRODUCT"
    MIN = "MIN"
    MAX = "MAX"
    BAND = "BAND"
    BOR = "BOR"
    BXOR = "BXOR"


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
        """gloo's ``method`` on host tensors. gloo takes dense tensors only, so a strided
        one goes as a dense copy and its result is copied back (an XLA card's views are
        contiguous, so on a T20 ECCL takes them as they are)."""
        copies = []

        def dense(value):
            if isinstance(value, list):
                return [dense(v) for v in value]
            if isinstance(value, torch.Tensor) and not value.is_contiguous():
                copies.append((value, value.contiguous()))
                return copies[-1][1]
            return value

        getattr(self._gloo, method)(*[dense(a) for a in args]).wait()
        for view, copy in copies:
            view.copy_(copy)

    @staticmethod
    def _in_graph(name: str, inputs, outputs=None) -> None:
        """The collective as an op of the card's lazy graph (mmgcu.sim.graph): no cut, as
        torch_xla's all_reduce. ASSUMED for ECCL: the 1.x source shows its Python layer only."""
        inputs = list(inputs)
        state.ext.graph_collective(name, inputs, inputs if outputs is None else list(outputs))

    def _reduce_hosts(self, hosts, op: ReduceOp) -> None:
        """All-reduce host tensors in place."""
        if op is ReduceOp.SUM and wire.gathered_sum(self._gloo, hosts):
            return
        opts = _c10d.AllreduceOptions()
        opts.reduceOp = getattr(_c10d.ReduceOp, op.name)
        self._run("allreduce", hosts, opts)

    def allreduce(self, tensors, op: ReduceOp):
        self._reduce_hosts([self._host(t) for t in tensors], op)
        self._in_graph(f"allreduce.{op.name}", tensors)
        return _Work(tensors)

    def broadcast(self, tensors, root: int):
        opts = _c10d.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        self._run("broadcast", [self._host(t) for t in tensors], opts)
        self._in_graph("broadcast", tensors)
        return _Work(tensors)

    def reduce(self, tensors, root: int, op: ReduceOp):
        opts = _c10d.ReduceOptions()
        opts.rootRank, opts.rootTensor = root, 0
        opts.reduceOp = getattr(_c10d.ReduceOp, op.name)
        self._run("reduce", [self._host(t) for t in tensors], opts)
        self._in_graph(f"reduce.{op.name}", tensors)
        return _Work(tensors)

    def allgather(self, output_lists, inputs):
        outs = [[self._host(t) for t in out] for out in output_lists]
        self._run("allgather", outs, [self._host(t) for t in inputs])
        self._in_graph("allgather", inputs, [t for out in output_lists for t in out])
        return _Work(output_lists)

    def _allgather_base(self, output, input):  # noqa: A002 (the 1.x name)
        source, host = self._host(input), self._host(output)
        dense = host if host.is_contiguous() else host.contiguous()
        rows = dense.view(self.size(), -1).unbind(0)
        self._run("allgather", [[r.view_as(source) for r in rows]], [source])
        if dense is not host:
            host.copy_(dense)
        self._in_graph("allgather", [input], [output])
        return _Work([output])

    def reduce_scatter(self, outputs, input_lists, op: ReduceOp):
        # torch 1.10's gloo has no reduce_scatter: every rank reduces all the parts and
        # keeps its own (the same sums, in place, as ECCL's reduce-scatter gives).
        parts = torch.stack([self._host(t) for t in input_lists[0]])
        self._reduce_hosts([parts], op)
        self._host(outputs[0]).copy_(parts[self.rank()])
        self._in_graph(f"reduce_scatter.{op.name}", input_lists[0], outputs)
        return _Work(outputs)

    def _reduce_scatter_base(self, output, input, op: ReduceOp):  # noqa: A002
        host = self._host(output)
        parts = self._host(input).reshape(self.size(), -1).clone()
        self._reduce_hosts([parts], op)
        host.copy_(parts[self.rank()].view_as(host))
        self._in_graph(f"reduce_scatter.{op.name}", [input], [output])
        return _Work([output])

    def alltoall(self, outputs, inputs):
        # torch 1.10's gloo has no alltoall of tensor lists: one alltoall_base of them all.
        sent = torch.cat([self._host(t).reshape(-1) for t in inputs])
        sizes = [t.numel() for t in outputs]
        received = sent.new_empty(sum(sizes))
        self._run(
            "alltoall_base",
            received,
            sent,
            sizes,
            [t.numel() for t in inputs],
            _c10d.AllToAllOptions(),
        )
        for t, part in zip(outputs, received.split(sizes)):
            self._host(t).copy_(part.view_as(t))
        self._in_graph("alltoall", inputs, outputs)
        return _Work(outputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes):  # noqa: A002
        self._run(
            "alltoall_base",
            self._host(output),
            self._host(input),
            list(output_split_sizes),
            list(input_split_sizes),
            _c10d.AllToAllOptions(),
        )
        self._in_graph("alltoall", [input], [output])
        return _Work([output])

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


def _check_op(op, call: str) -> None:
    if not isinstance(op, ReduceOp):
        raise TypeError(f"{call}(): op must be a torch_gcu.distributed.ReduceOp, got {op!r}")


def _group_rank(group, pg, rank: int) -> int:
    """The group rank of global ``rank``; -1 (DDP's "the group's first rank") is 0."""
    if rank == -1:
        return 0
    return rank if group is None else _pg_group_ranks[pg][rank]


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):  # noqa: A002
    _check_op(op, "all_reduce")
    pg = _group(group)
    if pg is None:
        return None
    return _finish(pg.allreduce([tensor], op), async_op)


def broadcast(tensor, src, group=None, async_op=False):  # noqa: A002
    pg = _group(group)
    if pg is None:
        return None
    return _finish(pg.broadcast([tensor], _group_rank(group, pg, src)), async_op)


def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False):  # noqa: A002
    _check_op(op, "reduce")
    pg = _group(group)
    if pg is None:
        return None
    return _finish(pg.reduce([tensor], _group_rank(group, pg, dst), op), async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):  # noqa: A002
    pg = _group(group)
    if pg is None:
        return None
    return _finish(pg.allgather([tensor_list], [tensor]), async_op)


def _all_gather_base(output_tensor, input_tensor, group=None, async_op=False):  # noqa: A002
    pg = _group(group)
    if pg is None:
        return None
    return _finish(pg._allgather_base(output_tensor, input_tensor), async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):  # noqa: A002
    _check_op(op, "reduce_scatter")
    pg = _group(group)
    if pg is None:
        return None
    return _finish(pg.reduce_scatter([output], [input_list], op), async_op)


def _reduce_scatter_base(output, input, op=ReduceOp.SUM, group=None, async_op=False):  # noqa: A002
    _check_op(op, "_reduce_scatter_base")
    pg = _group(group)
    if pg is None:
        return None
    return _finish(pg._reduce_scatter_base(output, input, op), async_op)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):  # noqa: A002
    pg = _group(group)
    if pg is None:
        return None
    return _finish(pg.alltoall(output_tensor_list, input_tensor_list), async_op)


def all_to_all_single(
    output,
    input,  # noqa: A002 (the 1.x signature)
    output_split_sizes=None,
    input_split_sizes=None,
    group=None,  # noqa: A002
    async_op=False,
):
    pg = _group(group)
    if pg is None:
        return None
    work = pg.alltoall_base(output, input, output_split_sizes or [], input_split_sizes or [])
    return _finish(work, async_op)


def barrier(group=None, async_op=False, device_ids=None):  # noqa: A002
    pg = _group(group)
    if pg is None:
        return None
    return _finish(pg.barrier(), async_op)
