"""torch_gcu 1.x, the T20 stack (TopsRider 2.x, torch 1.10): cards are lazy XLA devices.

Read from the Python layer of a public 1.x release (repository ``mango-MilkT/GCU-PC-share``,
folder ``torch_gcu/``); each call below names the file it relies on. Only torch 1.10 APIs.

What that source shows and mmgcu builds on:

- ``core/device.py``: cards are ``gcu_device(i)`` = ``xla:i``; ``set_device`` silently
  ignores an index that is not a card (so mmgcu checks the index first).
- ``distributed/distributed_c10d.py``: ``torch_gcu.distributed`` is a world of its own
  with ECCL only; torch.distributed does not know ``'eccl'``; no object collectives.
  torch.distributed's default group is therefore mmgcu's ``gloo_eccl``
  (:mod:`mmgcu.device.gcu1_dist`): CPU tensors (mmengine's collectives) over gloo, card
  tensors of model code's own torch.distributed calls over the ECCL world. Card tensors
  get an ECCL group of torch_gcu.distributed, created with a group name of its own (both
  worlds prefix their keys on torchrun's store with ``default_pg`` and would otherwise
  both use group name ``'0'``). ECCL has its own ``ReduceOp`` and no ``gather``,
  ``scatter`` or coalesced calls.
- ``distributed/rendezvous.py``: off torchrun's agent store (slurm, mpi, and torch 1.10's
  ``torchrun --standalone``, which sets ``TORCHELASTIC_USE_AGENT_STORE=False``), its rank 0
  hosts its own store server, at MASTER_PORT by default, where torch.distributed's rank 0
  already listens. mmgcu gives it a free port that rank 0 picks and sends to every rank
  over the gloo group.
- ``nn/parallel/distributed.py``: its DDP is an ``nn.Module`` (not torch's DDP) whose
  ``device_ids=None`` means every visible card; mmgcu passes ``[this rank's card]``.
- ``core/model.py``: the step is ``optimizer_step(optimizer, extra_output, model=...,
  mode=JitRunMode)``: ``optimizer.step()``, then ``_sync_multi`` of the parameters, the
  optimizer state on the card, the model's buffers and ``extra_output``. AMP runs
  ``scaler.step``, ``scaler.update`` and then
  ``unlazy(collect_amp_training_params(model, optimizer, scaler) + [loss])``. mmgcu splits
  both the same way: the optimizer steps at once, and the graph with those outputs runs at
  the end of the iteration (:meth:`GCU1Accelerator.finish_step`), with what the log will
  read of the iteration among them; read later, a value no graph output is computed again
  by a graph of its own (torch_xla's semantics, which the 1.x runtime forks).
- ``core/debug.py``: ``metrics_report()`` returns the runtime's metrics as text; its format
  is not public (ASSUMED: torch_xla 1.x's, ``Counter: UncachedCompile`` / ``Value: N``).
- ``amp/``: autocast takes float16 and bfloat16; ``GradScaler`` is a plain object whose
  ``use_zero_grad=True`` avoids the host barrier of the inf check (its other path calls
  ``unlazy`` with an argument ``unlazy`` does not take).
- ``core/debug.py``: memory only as ``get_hbm_alloc_size`` (allocated now, no peak);
  no ``empty_cache``. ``core/random.py``: ``manual_seed_all`` only.
  ``core/version.py``: ``get_version()``.

ASSUMED (the source is silent; the strictest reading is taken):

- ECCL carries only card tensors, each group bound to the card of ``LOCAL_RANK``.
- A torch.distributed store cannot be handed to torch_gcu.distributed (its stores are
  its own C++ classes), so each world makes its own store client or server.
- ``get_hbm_alloc_size`` does not run the pending graph (it is read once per log line).
- An ECCL collective of a card tensor is an op of the card's lazy graph (torch_xla's
  semantics): it runs when that graph runs (see :mod:`mmgcu.device.gcu1_dist` for the
  order kept with gloo). ``torch_gcu.unlazy`` on its tensors launches it.
"""

import datetime
import os
import re
from typing import List, Optional

import torch

from ..errors import GCUError
from ..launch.ports import free_port
from . import gcu1_dist
from .base import Accelerator, CardGroup, simulated, step_seed

#: ``env_cfg.gcu_jit_mode`` values; None picks ASYNC for several ranks, SAFEASYNC for one,
#: as Enflame's own training scripts do.
JIT_MODES = ("SYNC", "ASYNC", "SAFEASYNC")
ECCL_GROUP_NAME = "mmgcu_eccl"
#: A counter of torch_xla 1.x's metrics report (ASSUMED to be torch_gcu 1.x's format too).
_COUNTER = re.compile(r"^Counter: (\S+)\n\s+Value: (\d+)", re.MULTILINE)


class GCU1Accelerator(Accelerator):
    kind = "gcu1"
    device_type = "xla"
    is_gcu = True
    lazy = True
    seeds_each_step = True
    default_pg_backend = gcu1_dist.BACKEND
    #: Plain gloo too, if a config asks for it: mmengine's collectives and the card group
    #: work as on gloo_eccl, but model code's torch.distributed calls on card tensors fail.
    other_pg_backends = ("gloo",)
    amp_dtypes = (torch.float16, torch.bfloat16)

    def __init__(self, torch_gcu, jit_mode: Optional[str] = None):
        super().__init__()
        self.torch_gcu = torch_gcu
        self.simulated = simulated(torch_gcu)
        self.description = f"torch_gcu {torch_gcu.get_version()} (1.x, XLA 'xla')"
        if jit_mode is not None and jit_mode not in JIT_MODES:
            raise GCUError(f"env_cfg.gcu_jit_mode={jit_mode!r}: use one of {JIT_MODES}")
        self.jit_mode = jit_mode
        self._step_outputs: Optional[List[torch.Tensor]] = None  # a step not yet run
        self._carried: List[torch.Tensor] = []  # what iterations without a step logged
        self._card_seed = 0  # the cards' seed, from manual_seed_all, renewed after each step
        #: Where the card tensors of torch.distributed's gloo_eccl groups go.
        self.routes = gcu1_dist.CardRoute(self.device_type)
        self.pg_backend = self.default_pg_backend

    def is_available(self) -> bool:
        return bool(self.torch_gcu.is_available())

    def device_count(self) -> int:
        return int(self.torch_gcu.device_count())

    def current_device(self) -> int:
        return int(self.torch_gcu.current_device())

    def set_device(self, index: int) -> None:
        if not 0 <= index < self.device_count():  # 1.x would ignore it without a word
            raise GCUError(f"card {index} does not exist: {self.device_count()} card(s) visible")
        self.torch_gcu.set_device(index)

    def device(self, index: Optional[int] = None) -> torch.device:
        return self.torch_gcu.gcu_device(self.current_device() if index is None else index)

    def device_name(self, index: int = 0) -> str:
        return str(self.torch_gcu.get_device_name(index))

    def peak_memory(self, index: int) -> Optional[int]:
        return int(self.torch_gcu.get_hbm_alloc_size(index))

    @property
    def memory_source(self) -> str:
        return "HBM allocated at the log line (torch_gcu 1.x get_hbm_alloc_size; no peak)"

    def manual_seed_all(self, seed: int) -> None:
        self._card_seed = int(seed) % 2**32
        self.torch_gcu.manual_seed_all(self._card_seed)

    def _next_seed(self) -> None:
        """A new seed after each step's graph, as torch_xla's step marker makes one
        (:func:`~.base.step_seed`): a random op's seed is IR that chains on the last
        one until a step marker or a new seed restarts it, and 1.x's step (_sync_multi,
        torch_xla's sync of listed tensors) is not a marker, so a model with dropout would
        compile a longer graph every step. ASSUMED: torch_gcu keeps torch_xla's chain (its
        source shows the Python layer only); a new seed costs a host call either way."""
        self._card_seed = step_seed(self._card_seed)
        self.torch_gcu.manual_seed_all(self._card_seed)

    def check_collectives(self) -> None:
        if not self._gcu_dist().is_eccl_available():
            raise GCUError(
                "ECCL is not available: torch_gcu.distributed.is_eccl_available() is False "
                "(torch_gcu could not load ProcessGroupECCL). Install the ECCL package of "
                "your TopsRider release."
            )

    def _gcu_dist(self):
        import torch_gcu.distributed as gcu_dist

        return gcu_dist

    def init_process_groups(self, pg_backend: str, timeout=None, **kwargs) -> CardGroup:
        """torch.distributed's default group (``pg_backend``: gloo_eccl, or gloo), then
        torch_gcu.distributed's ECCL world, to which gloo_eccl sends card tensors."""
        import torch.distributed as dist

        timeout = timeout or datetime.timedelta(minutes=30)
        self.pg_backend = pg_backend
        if pg_backend == gcu1_dist.BACKEND:
            gcu1_dist.register(self.routes)
        try:
            dist.init_process_group(backend=pg_backend, timeout=timeout, **kwargs)
        except Exception as e:
            raise GCUError(f"creating the torch.distributed {pg_backend} group failed: {e}") from e
        gcu_dist = self._gcu_dist()
        try:
            gcu_dist.init_process_group(
                "eccl",
                init_method=eccl_init_method(dist),
                timeout=timeout,
                group_name=ECCL_GROUP_NAME,
            )
        except Exception as e:
            raise GCUError(
                f"creating the ECCL group (torch_gcu.distributed, for card tensors) failed: {e}"
            ) from e
        if self.jit_mode is None:
            self.jit_mode = "ASYNC" if dist.get_world_size() > 1 else "SAFEASYNC"
        return self._card_group(gcu_dist)

    def adopt_process_groups(self) -> CardGroup:
        gcu_dist = self._gcu_dist()
        if not gcu_dist.is_initialized():
            raise GCUError(
                "torch.distributed was initialised before GCURunner, but torch_gcu.distributed "
                "was not, so card tensors have no ECCL group. Let GCURunner create both (a "
                "launcher and no init_process_group of your own), or also call "
                "torch_gcu.distributed.init_process_group('eccl', group_name='mmgcu_eccl')."
            )
        return self._card_group(gcu_dist)

    def _card_group(self, gcu_dist) -> CardGroup:
        """The ECCL world as the card group; gloo_eccl groups send card tensors to it."""
        self.routes.bind(gcu_dist, gcu_dist.group.WORLD, self.launch)
        self.card_group = CardGroup(gcu_dist, gcu_dist.group.WORLD, "torch_gcu.distributed eccl")
        return self.card_group

    def launch(self, tensors) -> None:
        """Run the card graphs that compute ``tensors`` (the step's JIT mode: ASYNC, as
        with several ranks, returns without waiting)."""
        self.torch_gcu.unlazy(list(tensors), mode=self._mode())

    def ddp_kwargs(self, card: int):
        # device_ids=None would replicate the model onto every visible card.
        return dict(device_ids=[card], process_group=self.card_group.group)

    def vendor_ddp(self) -> type:
        return self.torch_gcu.nn.parallel.DistributedDataParallel

    def autocast(self, dtype=torch.float16, enabled=True):
        if dtype not in self.amp_dtypes:
            raise GCUError(f"torch_gcu 1.x autocast supports float16 and bfloat16, not {dtype}")
        return self.torch_gcu.amp.autocast(enabled=enabled, dtype=dtype)

    # Only 'zero': the 1.x GradScaler's skipping path (use_zero_grad=False) calls unlazy
    # with an argument unlazy does not take; use_zero_grad=True has no host barrier either.
    overflow_steps = ("zero",)

    def grad_scaler(self, overflow_step=None, **kwargs):
        self._overflow_step(overflow_step)
        return self.torch_gcu.amp.GradScaler(use_zero_grad=True, **kwargs)

    def _mode(self):
        return getattr(self.torch_gcu.JitRunMode, self.jit_mode or "SAFEASYNC")

    def optimizer_step(self, optimizer, model=None, loss=None, **kwargs) -> None:
        self.finish_step()  # a step that no hook finished runs before this one
        if model is None:  # every live value is an output: nothing to collect, run it now
            self.torch_gcu.optimizer_step(
                optimizer, optimizer_args=kwargs, mode=self._mode(), device=self.current_device()
            )
            return
        optimizer.step(**kwargs)
        self._step_outputs = step_outputs(optimizer, model) + _card(loss)

    def after_amp_step(self, optimizer, model, scaler, loss) -> None:
        self.finish_step()
        outputs = self.torch_gcu.collect_amp_training_params(model, optimizer, scaler)
        # torch 2's Adam keeps its step count in a CPU tensor, which unlazy would refuse
        self._step_outputs = [t for t in outputs if _on_card(t)] + _card(loss)

    def finish_step(self, extra=()) -> None:
        outputs, self._step_outputs = self._step_outputs, None
        self._carried += list(extra)
        if outputs is None:
            # an iteration that accumulated gradients without a step: its values stay in
            # the graph, which the next step's one run outputs with that step's
            return
        self.torch_gcu.unlazy(outputs + self._carried, mode=self._mode())
        self._carried = []
        self._next_seed()

    def compiled_graphs(self) -> Optional[int]:
        report = getattr(self.torch_gcu, "metrics_report", None)
        if report is None:
            return None
        try:
            counters = dict(_COUNTER.findall(str(report())))
        except Exception:  # a runtime that cannot report: no figure rather than a failure
            return None
        value = counters.get("UncachedCompile")
        return int(value) if value is not None else None

    def summary(self):
        facts = super().summary()
        facts["process_groups"] = (
            f"torch.distributed {self.pg_backend} + torch_gcu.distributed eccl"
        )
        facts["jit_mode"] = self.jit_mode or "ASYNC with several ranks, else SAFEASYNC"
        return facts


def eccl_init_method(dist) -> str:
    """Where torch_gcu.distributed's ranks meet: torchrun's agent store when there is one;
    otherwise a store server of its own on a port rank 0 picks (and sends over ``dist``,
    torch.distributed's gloo group), since MASTER_PORT is taken by torch.distributed's."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return "env://"
    port = [free_port() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(port, src=0)
    addr, rank, world = os.environ["MASTER_ADDR"], dist.get_rank(), dist.get_world_size()
    return f"tcp://{addr}:{port[0]}?rank={rank}&world_size={world}"


def step_outputs(optimizer, model) -> List[torch.Tensor]:
    """What ``torch_gcu.optimizer_step(model=model)`` outputs (core/model.py of 1.x): each
    parameter, its optimizer state on the card, and the model's buffers. The parameters and
    buffers themselves, where 1.x takes their ``.data``: the same value on 1.x, whose
    ``.data`` shares its tensor's XLA data, and on torch_xla 2.x, whose functionalized
    ``.data`` is an alias that a sync leaves the parameter out of (its graph would grow
    every step)."""
    outputs = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            outputs.append(p)
            for value in optimizer.state[p].values():  # plain loops: no call per tensor
                if isinstance(value, torch.Tensor) and value.device.type == "xla":
                    outputs.append(value)
    return outputs + list(model.buffers())


def _on_card(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "xla"


def _card(loss) -> List[torch.Tensor]:
    return [loss] if _on_card(loss) else []
