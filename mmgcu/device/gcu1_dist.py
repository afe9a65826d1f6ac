"""torch.distributed groups that route by device on torch_gcu 1.x: CPU tensors to gloo,
card tensors to ECCL.

On torch_gcu 1.x (the T20's generation) torch.distributed has no backend for card tensors
(``xla:N``): ECCL lives in ``torch_gcu.distributed``, a c10d world of its own that a
torch.distributed call cannot reach. Model code that all-reduces a card tensor with
torch.distributed (mmdet's ``reduce_mean`` in Mask2Former's and MaskFormer's losses, the
``reduce_mean`` of EMANet's ``EMAModule``) stops at gloo there. mmgcu therefore gives
torch.distributed a backend of its own, :data:`BACKEND`, registered through torch's public
``Backend.register_backend`` (:func:`register`) and chosen by
``GCU1Accelerator.init_process_groups`` for the default group; ``new_group`` without a
backend of its own takes it too. Each group of it is a :class:`RoutedGroup`:

- CPU tensors go to a gloo group of its own, as on a gloo group. mmengine sends CPU
  tensors for a backend it does not know (``get_comm_device()``), so its object
  collectives stay on gloo;
- card tensors of the default group go to torch_gcu.distributed's ECCL world (torch's
  ``ReduceOp`` becomes ECCL's own, by name);
- card tensors of a subgroup (mmgcu makes one ECCL group: the world), and calls ECCL lacks
  (``gather``, ``scatter``, coalesced and point-to-point calls, ``ReduceOp.AVG``), go through
  the CPU and back under ``no_grad``; the group's first rank says so once per call;
- a call given CPU and card tensors together is refused.

torch builds such a group by calling the registered function with ``(prefix_store, rank,
world_size, timeout)`` (the rank and size within the group) and then only calls its
methods (``allreduce([t], opts)``, ``broadcast``, ``allgather``, ``barrier(opts=)``,
``rank()``, ``size()``) and ``wait()`` on what they return. torch 1.10 takes any object as
a group (its ``ProcessGroup`` has no Python constructor); torch >= 1.11 takes a Python
subclass of ``ProcessGroup`` as the group itself, which torch 2.x needs (another object is
registered as a C++ backend there).

The order of the two communicators on a lazy card (docs/t20.md, "Collectives of model
code"): before any call of these groups waits on the host (a gloo call, or a card call
through the CPU), the card graphs that hold the ECCL calls they issued are launched
(``torch_gcu.unlazy`` on those calls' tensors), so no rank waits on the host while an ECCL
call it issued is still unlaunched.
"""

import atexit
import collections
import inspect
import logging
import weakref
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

from ..errors import GCUError

logger = logging.getLogger(__name__)

#: The backend's name: not one mmengine knows (hccl, nccl, cncl, smddp, mccl, xccl), so its
#: ``get_comm_device()`` is the CPU and mmengine's own collectives send CPU tensors (gloo).
BACKEND = "gloo_eccl"
#: torch's reduce ops that torch_gcu 1.x's ``ReduceOp`` has too (by name; its source names
#: these). torch's ``AVG`` and ``PREMUL_SUM`` (torch >= 1.11) go through the CPU.
ECCL_OPS = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
_TORCH_OPS = ECCL_OPS + ("AVG", "PREMUL_SUM")


def _group_base() -> type:
    """torch's ``ProcessGroup`` where Python may subclass it (torch >= 1.11, pytorch PR
    66338); on torch 1.10, which defines no Python constructor for it, a plain object."""
    try:
        dist.ProcessGroup(0, 1)
    except TypeError:  # "No constructor defined!"
        return object
    return dist.ProcessGroup


_GROUP_BASE = _group_base()


def op_name(op) -> str:
    """The name of a torch.distributed ``ReduceOp`` (torch 1.10: an enum; torch 2.x: a
    class whose members compare equal to it)."""
    for name in _TORCH_OPS:
        if hasattr(dist.ReduceOp, name) and op == getattr(dist.ReduceOp, name):
            return name
    raise ValueError(f"unknown torch.distributed reduce op {op!r}")


def _flat(values) -> list:
    """The tensors of ``values`` (tensors and lists of them, nested)."""
    if isinstance(values, torch.Tensor):
        return [values]
    return [t for v in values for t in _flat(v)]


def _same(value):
    return value


def _given(opts) -> tuple:
    """``opts`` as the trailing argument of a gloo call (torch passes none to some)."""
    return () if opts is None else (opts,)


class CardRoute:
    """Where the card tensors of this process's routed groups go: torch_gcu.distributed's
    ECCL world (once it exists and is bound), and which card graphs to launch before a
    routed group waits on the host.

    Args:
        device_type: the cards' ``torch.device`` type (``'xla'``).
    """

    #: Notes of issued ECCL calls kept before the dead ones are dropped.
    PRUNE_AT = 256

    def __init__(self, device_type: str):
        self.device_type = device_type
        self.eccl = None
        self.group = None
        self._launch: Optional[Callable[[list], None]] = None
        self._issued: List[weakref.ref] = []

    @property
    def bound(self) -> bool:
        return self.eccl is not None

    def bind(self, eccl, group, launch: Callable[[list], None]) -> None:
        """Send the default group's card tensors to ``group`` of ``eccl``
        (torch_gcu.distributed) from now on; ``launch(tensors)`` runs the card graphs
        that compute ``tensors`` without waiting for them."""
        self.eccl, self.group, self._launch = eccl, group, launch

    def issued(self, tensors) -> None:
        """Note the card tensors an ECCL call writes: the graph that holds the call is
        launched before the next host wait. Weak references: a note keeps no memory."""
        self._issued.extend(weakref.ref(t) for t in tensors)
        if len(self._issued) > self.PRUNE_AT:
            self._issued = [r for r in self._issued if r() is not None]

    def before_host_wait(self) -> None:
        """Launch the graphs of the ECCL calls issued since the last host wait. A call
        whose tensors are all freed is left to the graph that consumed them."""
        alive = [t for t in (r() for r in self._issued) if t is not None]
        self._issued = []
        if alive and self._launch is not None:
            self._launch(alive)


class _CopyBack:
    """The work of a card call made through the CPU: waiting for it copies the results
    back to the card. Other attributes are the gloo work's."""

    def __init__(self, work, pairs):
        self._work = work
        self._pairs = pairs

    def wait(self, *args, **kwargs) -> bool:
        self._work.wait(*args, **kwargs)
        with torch.no_grad():
            for card, host in self._pairs:
                card.copy_(host)
        self._pairs = []
        return True

    def is_completed(self) -> bool:
        if self._pairs and self._work.is_completed():
            self.wait()
        return not self._pairs

    def __getattr__(self, name):
        return getattr(self._work, name)


class RoutedGroup(_GROUP_BASE):
    """A torch.distributed group of :data:`BACKEND`: CPU tensors over gloo, card tensors
    over ECCL or through the CPU (see the module).

    Args:
        store, rank, size, timeout: what torch gives a backend (a prefix store, the rank
            and size within the group, the collectives' timeout).
        route: this process's :class:`CardRoute`.
        world: whether this is the default group, whose card tensors may use the ECCL
            world (a subgroup's go through the CPU).

    Attributes:
        counts: calls made, by ``'<call> <route>'`` (route ``gloo``, ``eccl`` or ``cpu``:
            card tensors through the CPU).
    """

    def __init__(self, store, rank: int, size: int, timeout, route: CardRoute, world: bool):
        if _GROUP_BASE is not object:
            super().__init__(rank, size)
        self._group_rank, self._group_size = rank, size
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._route = route
        self._world = world
        self._said = set()
        self.counts = collections.Counter()
        # A gloo group left to interpreter teardown can abort the process: release it
        # while Python is still whole.
        atexit.register(_release, weakref.ref(self))

    def rank(self) -> int:
        return self._group_rank

    def size(self) -> int:
        return self._group_size

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND

    def __repr__(self) -> str:
        kind = "default group" if self._world else "subgroup"
        return f"RoutedGroup({BACKEND} {kind}, rank {self._group_rank} of {self._group_size})"

    # -- routing ---------------------------------------------------------------------------
    def _call(self, call: str, tensors, outputs, gloo, eccl=None, lacks: str = ""):
        """Run torch.distributed's ``call`` on this group.

        Args:
            call: its torch.distributed name (for the log and errors).
            tensors: every tensor it is given, inputs and outputs.
            outputs: the tensors it writes.
            gloo: runs it on gloo: ``gloo(host)``, where ``host`` maps a tensor (or a
                list of them) to the one gloo takes.
            eccl: runs it on the ECCL world: ``eccl(torch_gcu.distributed, its world
                group)``; None where ECCL lacks it, ``lacks`` saying what.
        """
        on_card = self._on_card(call, tensors)
        if on_card and eccl is not None and self._world and self._route.bound:
            self.counts[f"{call} eccl"] += 1
            work = eccl(self._route.eccl, self._route.group)
            self._route.issued(outputs)
            return work
        self._route.before_host_wait()
        if not on_card:
            self.counts[f"{call} gloo"] += 1
            return gloo(_same)
        return self._through_cpu(
            call, self._why_cpu(lacks if eccl is None else ""), tensors, outputs, gloo
        )

    def _on_card(self, call: str, tensors) -> bool:
        """Whether the call's tensors are card tensors (all of them); refuses a mix."""
        kinds = {t.device.type for t in tensors}
        card = self._route.device_type
        if card in kinds and len(kinds) > 1:
            raise GCUError(
                f"torch.distributed.{call} was given tensors on {' and '.join(sorted(kinds))} "
                f"in one call. On torch_gcu 1.x mmgcu's {BACKEND} group sends CPU tensors "
                "over gloo and card tensors over ECCL, and one call cannot use both: put "
                "every tensor of the call on this rank's card, or every one on the CPU."
            )
        return kinds == {card}

    def _why_cpu(self, lacks: str) -> str:
        if lacks:
            return lacks
        if not self._world:
            return "on a subgroup: mmgcu's one ECCL group is torch_gcu.distributed's world"
        return "torch_gcu.distributed's ECCL world is not bound to this group"

    def _through_cpu(self, call: str, why: str, tensors, outputs, gloo):
        """``call`` on CPU copies of card tensors; its work copies the results back."""
        if (call, why) not in self._said:
            self._said.add((call, why))
            if self._group_rank == 0:
                logger.warning(
                    "mmgcu: torch.distributed.%s of card tensors goes through the CPU and "
                    "back (%s): a host read and a copy to the card per call",
                    call,
                    why,
                )
        self.counts[f"{call} cpu"] += 1
        with torch.no_grad():
            copies = {id(t): t.detach().cpu() for t in tensors}

        def host(value):
            if isinstance(value, torch.Tensor):
                return copies[id(value)]
            return [host(v) for v in value]

        work = gloo(host)
        return _CopyBack(work, [(t, copies[id(t)]) for t in outputs])

    @staticmethod
    def _reduce(opts, eccl_call):
        """A reducing call on ECCL with ECCL's own ReduceOp (``eccl_call(eccl, group, op)``),
        or None and what ECCL lacks where it has no op of that name."""
        name = op_name(opts.reduceOp)
        if name not in ECCL_OPS:
            return None, f"torch_gcu 1.x's ECCL ReduceOp has no {name}"

        def on_eccl(eccl, group):
            return eccl_call(eccl, group, getattr(eccl.ReduceOp, name))

        return on_eccl, ""

    # -- collectives, as torch.distributed calls them --------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        eccl, lacks = self._reduce(
            opts,
            lambda e, g, op: e.all_reduce(tensors[0], op=op, group=g, async_op=True),
        )
        if len(tensors) != 1:
            eccl, lacks = None, "torch_gcu 1.x's ECCL all_reduce takes one tensor"
        return self._call(
            "all_reduce",
            tensors,
            tensors,
            lambda h: self._gloo.allreduce(h(tensors), opts),
            eccl,
            lacks,
        )

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        return self._call(
            "broadcast",
            tensors,
            tensors,
            lambda h: self._gloo.broadcast(h(tensors), opts),
            lambda e, g: e.broadcast(tensors[0], opts.rootRank, group=g, async_op=True),
        )

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        eccl, lacks = self._reduce(
            opts,
            lambda e, g, op: e.reduce(tensors[0], opts.rootRank, op=op, group=g, async_op=True),
        )
        return self._call(
            "reduce", tensors, tensors, lambda h: self._gloo.reduce(h(tensors), opts), eccl, lacks
        )

    def allgather(self, output_lists, inputs, opts=None):
        return self._call(
            "all_gather",
            _flat([output_lists, inputs]),
            _flat(output_lists),
            lambda h: self._gloo.allgather(h(output_lists), h(inputs), *_given(opts)),
            lambda e, g: e.all_gather(output_lists[0], inputs[0], group=g, async_op=True),
        )

    def _allgather_base(self, output, input, opts=None):  # noqa: A002 (torch's name)
        return self._call(
            "all_gather_into_tensor",
            [output, input],
            [output],
            lambda h: self._gloo._allgather_base(h(output), h(input), *_given(opts)),
            lambda e, g: e._all_gather_base(output, input, group=g, async_op=True),
        )

    all_gather_single = _allgather_base  # torch 2.x's name

    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        eccl, lacks = self._reduce(
            opts,
            lambda e, g, op: e.reduce_scatter(
                outputs[0], input_lists[0], op=op, group=g, async_op=True
            ),
        )
        return self._call(
            "reduce_scatter",
            _flat([outputs, input_lists]),
            outputs,
            lambda h: self._gloo.reduce_scatter(h(outputs), h(input_lists), opts),
            eccl,
            lacks,
        )

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002 (torch's name)
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        eccl, lacks = self._reduce(
            opts,
            lambda e, g, op: e._reduce_scatter_base(output, input, op=op, group=g, async_op=True),
        )
        return self._call(
            "reduce_scatter_tensor",
            [output, input],
            [output],
            lambda h: self._gloo._reduce_scatter_base(h(output), h(input), opts),
            eccl,
            lacks,
        )

    reduce_scatter_single = _reduce_scatter_base  # torch 2.x's name

    def alltoall(self, outputs, inputs, opts=None):
        return self._call(
            "all_to_all",
            outputs + inputs,
            outputs,
            lambda h: self._gloo.alltoall(h(outputs), h(inputs), *_given(opts)),
            lambda e, g: e.all_to_all(outputs, inputs, group=g, async_op=True),
        )

    def alltoall_base(self, output, input, output_splits, input_splits, opts=None):  # noqa: A002
        def on_eccl(e, g):
            return e.all_to_all_single(
                output, input, list(output_splits), list(input_splits), group=g, async_op=True
            )

        return self._call(
            "all_to_all_single",
            [output, input],
            [output],
            lambda h: self._gloo.alltoall_base(
                h(output), h(input), output_splits, input_splits, *_given(opts)
            ),
            on_eccl,
        )

    all_to_all_single = alltoall_base  # torch 2.x's name

    def barrier(self, opts=None):
        # No tensor: the host's barrier, after this process's ECCL calls are launched.
        return self._call("barrier", [], [], lambda h: self._gloo.barrier(*_given(opts)))

    # -- calls torch_gcu 1.x's ECCL lacks: card tensors go through the CPU ------------------
    def _lacking(self, call: str, tensors, outputs, gloo):
        lacks = f"torch_gcu 1.x's ECCL has no {call}"
        return self._call(call, tensors, outputs, gloo, None, lacks)

    def gather(self, output_lists, inputs, opts=None):
        return self._lacking(
            "gather",
            _flat([output_lists, inputs]),
            _flat(output_lists),
            lambda h: self._gloo.gather(h(output_lists), h(inputs), *_given(opts)),
        )

    def scatter(self, outputs, input_lists, opts=None):
        return self._lacking(
            "scatter",
            _flat([outputs, input_lists]),
            outputs,
            lambda h: self._gloo.scatter(h(outputs), h(input_lists), *_given(opts)),
        )

    def allreduce_coalesced(self, tensors, opts=None):
        return self._lacking(
            "all_reduce_coalesced",
            tensors,
            tensors,
            lambda h: self._gloo.allreduce_coalesced(h(tensors), *_given(opts)),
        )

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self._lacking(
            "all_gather_coalesced",
            _flat([output_lists, inputs]),
            _flat(output_lists),
            lambda h: self._gloo.allgather_coalesced(h(output_lists), h(inputs), *_given(opts)),
        )

    def send(self, tensors, dst: int, tag: int = 0):
        return self._lacking("send", tensors, [], lambda h: self._gloo.send(h(tensors), dst, tag))

    def recv(self, tensors, src: int, tag: int = 0):
        return self._lacking(
            "recv", tensors, tensors, lambda h: self._gloo.recv(h(tensors), src, tag)
        )

    def recv_anysource(self, tensors, tag: int = 0):
        return self._lacking(
            "recv", tensors, tensors, lambda h: self._gloo.recv_anysource(h(tensors), tag)
        )


def _release(ref) -> None:
    group = ref()
    gloo = getattr(group, "_gloo", None)
    if gloo is not None and hasattr(gloo, "shutdown"):
        group._gloo = None
        gloo.shutdown()


def register(route: CardRoute) -> None:
    """Register :data:`BACKEND` with torch.distributed: each group of it is a
    :class:`RoutedGroup` of ``route``. Registering again replaces the route."""

    def create(store, rank, size, timeout):
        # torch calls this before it sets the default group, and from new_group after.
        return RoutedGroup(store, rank, size, timeout, route, world=not dist.is_initialized())

    register_backend = dist.Backend.register_backend
    extra = {}
    if "devices" in inspect.signature(register_backend).parameters:  # torch >= 2.0
        extra["devices"] = ["cpu", route.device_type]
    register_backend(BACKEND, create, **extra)
