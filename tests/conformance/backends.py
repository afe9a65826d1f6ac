"""The two XLA cards a conformance program runs on, behind one interface.

- ``xla``: torch_xla 2.9 on the CPU (``PJRT_DEVICE=CPU``), a real XLA runtime that nobody
  here wrote: its counters (``ExecuteTime``'s samples, ``UncachedCompile``,
  ``CachedCompile``, ``aten::*``) are the oracle.
- ``sim``: one simulated T20 card (``xla:0``) of mmgcu's simulator, with the ``xla-cpu``
  lowering profile (torch_xla 2.9 on a CPU device) so that both run the same lowerings;
  ``MMGCU_SIM_XLA=t20`` gives the T20's own.

A program runs its code on ``backend.device``, calls ``backend.step()`` where a training
loop cuts its graph (``xm.mark_step()``; the simulated card's ``sync_lived_tensor``, the
same cut of every live value) and reads ``backend.counts()``.
"""

import importlib
import os
from typing import Dict


class XlaBackend:
    name = "xla"

    def __init__(self):
        os.environ.setdefault("PJRT_DEVICE", "CPU")
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.metrics as met

        self.xm, self.met = xm, met
        self.device = torch_xla.device()

    def step(self) -> None:
        self.xm.mark_step()

    def sync(self, tensors) -> None:
        """A graph of ``tensors`` alone (torch_gcu's unlazy is this call's fork)."""
        import torch_xla

        torch_xla._XLAC._xla_sync_multi(list(tensors), devices=[], wait=False)

    def reseed(self, seed: int) -> None:
        self.xm.set_rng_state(seed)

    def autocast(self, dtype):
        import torch

        return torch.autocast("xla", dtype=dtype)

    def torch_gcu_api(self) -> None:
        """torch_gcu 1.x's API over torch_xla (what mmgcu's GCU1Accelerator calls)."""
        from .torch_gcu_on_xla import install

        install()

    def init_world(self) -> None:
        """A torch.distributed world of one process whose card collectives are XLA ops."""
        import torch.distributed as dist
        import torch_xla.distributed.xla_backend  # noqa: F401 (registers the 'xla' backend)

        if not dist.is_initialized():
            _one_process_world()
            dist.init_process_group("xla", init_method="xla://")

    def counts(self) -> Dict[str, object]:
        # a run's ExecuteTime sample is taken when it ends: wait for those in flight
        self.xm.wait_device_ops()
        execute = self.met.metric_data("ExecuteTime")
        return dict(
            runs=int(execute[0]) if execute else 0,
            compiles=int(self.met.counter_value("UncachedCompile") or 0),
            cached=int(self.met.counter_value("CachedCompile") or 0),
            fallbacks={
                name: int(self.met.counter_value(name))
                for name in self.met.counter_names()
                if name.startswith("aten::")
            },
        )


class SimBackend:
    name = "sim"

    def __init__(self):
        os.environ.setdefault("MMGCU_SIMULATE", "t20:1")
        os.environ.setdefault("MMGCU_SIM_XLA", "xla-cpu")
        import mmgcu  # noqa: F401 (installs the simulator)
        from mmgcu.sim import graph

        # the simulated torch_gcu, which `import mmgcu` installed
        self.torch_gcu, self.graph = importlib.import_module("torch_gcu"), graph
        self.device = self.torch_gcu.gcu_device(0)

    def step(self) -> None:
        # torch_xla's mark_step: every live value, and the step marker, which restarts the
        # seed chain (the 1.x API has no marker of its own: the simulator's is used)
        self.torch_gcu.sync_lived_tensor(0)
        self.graph.state.ext.graph_restart_seed(0)

    def sync(self, tensors) -> None:
        self.torch_gcu.unlazy(list(tensors))

    def reseed(self, seed: int) -> None:
        self.torch_gcu.manual_seed_all(seed)

    def autocast(self, dtype):
        return self.torch_gcu.amp.autocast(dtype=dtype)  # torch_gcu 1.x's, on either torch

    def torch_gcu_api(self) -> None:
        """The simulated torch_gcu 1.x is installed already."""

    def init_world(self) -> None:
        """mmgcu's process groups on torch_gcu 1.x for a world of one process: gloo_eccl
        for torch.distributed (card tensors to ECCL), the ECCL world of torch_gcu."""
        import torch.distributed as dist

        if not dist.is_initialized():
            from mmgcu.device import select_accelerator

            _one_process_world()
            accelerator = select_accelerator("gcu1")
            accelerator.set_device(0)
            accelerator.init_process_groups(accelerator.default_pg_backend)

    def counts(self) -> Dict[str, object]:
        counts = self.graph.counters()
        return dict(
            runs=self.graph.graph_runs(counts),
            compiles=counts["UncachedCompile"],
            cached=counts["CachedCompile"],
            fallbacks={k: v for k, v in counts.items() if k.startswith("aten::")},
        )


def _one_process_world() -> None:
    import socket

    with socket.socket() as sock:  # a free port for the store
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    world = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0")
    os.environ.update(world, WORLD_SIZE="1")


def backend(name: str):
    return {"xla": XlaBackend, "sim": SimBackend}[name]()


def delta(after: Dict[str, object], before: Dict[str, object]) -> Dict[str, object]:
    """What happened between two ``counts()``."""
    fallbacks = {
        k: v - before["fallbacks"].get(k, 0)
        for k, v in after["fallbacks"].items()
        if v != before["fallbacks"].get(k, 0)
    }
    return dict(
        runs=after["runs"] - before["runs"],
        compiles=after["compiles"] - before["compiles"],
        fallbacks=fallbacks,
    )
