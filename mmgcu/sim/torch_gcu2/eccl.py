"""A simulated ECCL: a process group that runs each collective through gloo on host memory.

A card tensor is handed to gloo as a CPU alias of its host memory, so the collective
writes the card tensor in place. Like ECCL, it carries only card tensors: a CPU tensor
gets a route only when the group was created with one (``cpu:gloo,gcu:eccl``).
"""

import atexit
import weakref

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions, _create_work_from_future

from .. import state, wire


def _done(result):
    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _release(ref) -> None:
    group = ref()
    if group is not None and group._gloo is not None:
        gloo, group._gloo = group._gloo, None
        gloo.shutdown()


class SimECCL(dist.ProcessGroup):
    """ECCL for simulated cards, over a ``ProcessGroupGloo`` built from the same store."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._cpu_route = None
        # Stock scripts never destroy the group. A gloo backend owned from Python and left
        # to interpreter teardown can abort the process ("terminate called without an
        # active exception"); a real ECCL exits cleanly, so release gloo while Python is
        # still whole.
        atexit.register(_release, weakref.ref(self))

    def getBackendName(self):
        return "eccl"

    def name(self):
        return "eccl"

    def _host(self, t):
        if t.device.type == state.device_type:
            return state.ext.host_alias(t)  # the card's host memory, reduced in place
        if self._cpu_route is None:
            config = dist.distributed_c10d._world.pg_backend_config.get(self, "")
            self._cpu_route = "cpu:" in config
        if not self._cpu_route:
            raise RuntimeError(
                f"ECCL carries only GCU tensors, got a tensor on {t.device}: create the "
                "process group as 'cpu:gloo,gcu:eccl' to give CPU tensors a route"
            )
        return t

    def _run(self, method, *args):
        work = getattr(self._gloo, method)(*args)
        work.wait()

    def allreduce(self, tensors, opts):
        hosts = [self._host(t) for t in tensors]
        if not (opts.reduceOp == dist.ReduceOp.SUM and wire.gathered_sum(self._gloo, hosts)):
            self._run("allreduce", hosts, opts)
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts):
        self._run("allreduce_coalesced", [self._host(t) for t in tensors], opts)
        return _done(tensors)

    def broadcast(self, tensors, opts):
        self._run("broadcast", [self._host(t) for t in tensors], opts)
        return _done(tensors)

    def reduce(self, tensors, opts):
        self._run("reduce", [self._host(t) for t in tensors], opts)
        return _done(tensors)

    def allgather(self, output_lists, inputs, opts):
        outs = [[self._host(t) for t in lst] for lst in output_lists]
        self._run("allgather", outs, [self._host(t) for t in inputs], opts)
        return _done(output_lists)

    def _allgather_base(self, output, input, opts):
        # Gloo has no flat all-gather: gather into views of the flat output instead.
        chunks = list(self._host(output).view(-1).chunk(self.size()))
        self._run("allgather", [chunks], [self._host(input).reshape(-1)], opts)
        return _done([output])

    # torch >= 2.10 calls these "single" forms on the group from Python.
    def all_gather_single(self, output, input, opts):
        return self._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output, input, opts):
        total = self._host(input).clone()
        self._run("allreduce", [total], AllreduceOptions())
        self._host(output).copy_(total.view(-1).chunk(self.size())[self.rank()].view_as(output))
        return _done([output])

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def gather(self, output_lists, inputs, opts):
        outs = [[self._host(t) for t in lst] for lst in output_lists]
        self._run("gather", outs, [self._host(t) for t in inputs], opts)
        return _done(output_lists)

    def scatter(self, outputs, input_lists, opts):
        ins = [[self._host(t) for t in lst] for lst in input_lists]
        self._run("scatter", [self._host(t) for t in outputs], ins, opts)
        return _done(outputs)

    def reduce_scatter(self, outputs, input_lists, opts):
        ins = [[self._host(t) for t in lst] for lst in input_lists]
        self._run("reduce_scatter", [self._host(t) for t in outputs], ins, opts)
        return _done(outputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):
        self._run(
            "alltoall_base",
            self._host(output),
            self._host(input),
            output_split_sizes,
            input_split_sizes,
            opts,
        )
        return _done([output])

    def barrier(self, opts):
        self._run("barrier", opts)
        return _done([])

    def send(self, tensors, dst, tag):
        self._run("send", [self._host(t) for t in tensors], dst, tag)
        return _done(tensors)

    def recv(self, tensors, src, tag):
        self._run("recv", [self._host(t) for t in tensors], src, tag)
        return _done(tensors)


def register(device_type: str) -> None:
    """Register ``eccl`` as a torch.distributed backend for the simulated device type."""
    if "ECCL" in dist.Backend._plugins:
        return
    dist.Backend.register_backend("eccl", SimECCL, devices=[device_type])
