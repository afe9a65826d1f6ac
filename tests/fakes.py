"""Real mmgcu accelerators over faked vendor modules, so tests need no card.

Each builder returns a real :class:`~mmgcu.device.Accelerator` of its kind:

- :func:`gcu2`: ``GCU2Accelerator`` over a mocked ``torch.gcu`` (torch_gcu 2.x);
- :func:`gcu1`: ``GCU1Accelerator`` over :class:`FakeTorchGCU1`, a module with the torch_gcu
  1.x surface mmgcu uses (``get_version``, ``JitRunMode``, ``optimizer_step``, ``amp``,
  ``distributed``, ``nn.parallel.DistributedDataParallel``, ...);
- :func:`cuda`: ``CUDAAccelerator`` over a mocked ``torch.cuda``;
- :func:`cpu`: ``CPUAccelerator``.

Vendor modules are put in place with ``monkeypatch`` (``sys.modules['torch_gcu']``,
``torch.gcu``), so ``select_accelerator`` finds them too. Card choices and group creation
are appended to ``events`` (``("set_device", 3)``, ...), so a test can check their order.
``on_cpu=True`` makes the accelerator's ``device()`` answer the CPU (a recording mock), so
real modules count as placed on the card.
"""

import contextlib
import enum
import sys
import types
from unittest import mock

import torch
from mmengine.model import BaseModel
from torch.nn.parallel import DistributedDataParallel

from mmgcu.device.fallback import CPUAccelerator, CUDAAccelerator
from mmgcu.device.gcu1 import GCU1Accelerator
from mmgcu.device.gcu2 import GCU2Accelerator

#: What torch_gcu 2.x puts on ``torch.gcu`` (a ``torch.cuda``-like module).
GCU2_API = [
    "is_available",
    "device_count",
    "current_device",
    "set_device",
    "get_device_name",
    "synchronize",
    "memory_allocated",
    "max_memory_allocated",
    "reset_peak_memory_stats",
    "empty_cache",
    "manual_seed_all",
]

#: The keyword arguments of torch_gcu 1.x's DistributedDataParallel (not torch's DDP).
GCU1_DDP_ARGS = (
    "device_ids",
    "output_device",
    "dim",
    "broadcast_buffers",
    "process_group",
    "bucket_cap_mb",
    "find_unused_parameters",
    "check_reduction",
    "gradient_as_bucket_view",
)


class Cards:
    """The current card of a fake runtime; ``set`` records the choice in ``events``."""

    def __init__(self, current=0, events=None):
        self.current = current
        self.events = events if events is not None else []

    def set(self, index):
        self.events.append(("set_device", index))
        self.current = index

    def get(self):
        return self.current


def _on_cpu(monkeypatch, accelerator):
    monkeypatch.setattr(accelerator, "device", mock.Mock(return_value=torch.device("cpu")))


# -- torch_gcu 2.x ----------------------------------------------------------------------


def fake_torch_gcu2(version="2.5.0"):
    """The ``torch_gcu`` package of 2.x: it imports; the cards live on ``torch.gcu``."""
    module = types.ModuleType("torch_gcu")
    module.__version__ = version
    return module


def fake_torch_dot_gcu(cards=8, current=0, events=None):
    """``torch.gcu`` as a mock whose card choice follows ``set_device``."""
    state = Cards(current, events)
    gcu = mock.Mock(spec=GCU2_API)
    gcu.is_available.return_value = True
    gcu.device_count.return_value = cards
    gcu.current_device.side_effect = state.get
    gcu.set_device.side_effect = state.set
    gcu.get_device_name.return_value = "Enflame S60"
    gcu.max_memory_allocated.return_value = 3 * 1024 * 1024
    return gcu


def gcu2(monkeypatch, cards=8, current=0, events=None, on_cpu=False, eccl=True):
    """A ``GCU2Accelerator``; ``eccl`` gives torch.distributed ``is_eccl_available``."""
    torch_gcu = fake_torch_gcu2()
    monkeypatch.setitem(sys.modules, "torch_gcu", torch_gcu)
    monkeypatch.setattr(torch, "gcu", fake_torch_dot_gcu(cards, current, events), raising=False)
    if eccl:
        monkeypatch.setattr(torch.distributed, "is_eccl_available", lambda: True, raising=False)
    else:
        monkeypatch.delattr(torch.distributed, "is_eccl_available", raising=False)
    accelerator = GCU2Accelerator(torch_gcu)
    if on_cpu:
        _on_cpu(monkeypatch, accelerator)
    return accelerator


# -- torch_gcu 1.x ----------------------------------------------------------------------


class JitRunMode(enum.Enum):
    SYNC = 0
    ASYNC = 1
    SAFEASYNC = 2


class FakeGCU1DDP(torch.nn.Module):
    """Stands for ``torch_gcu.nn.parallel.DistributedDataParallel``: an ``nn.Module`` with a
    constructor of its own (not torch's DDP). Records its arguments, runs the module."""

    def __init__(self, module, **kwargs):
        unknown = sorted(set(kwargs) - set(GCU1_DDP_ARGS))
        if unknown:
            raise TypeError(f"__init__() got an unexpected keyword argument {unknown[0]!r}")
        super().__init__()
        self.module = module
        self.kwargs = kwargs
        self.grad_sync = True

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        self.grad_sync = False
        try:
            yield
        finally:
            self.grad_sync = True


class FakeAutocast:
    """``torch_gcu.amp.autocast``: records its arguments and when it is entered and left."""

    def __init__(self, events, enabled=True, dtype=torch.float16, cache_enabled=True):
        self.events = events
        self.enabled = enabled
        self.dtype = dtype

    def __enter__(self):
        self.events.append(("autocast", self.dtype, self.enabled))
        return self

    def __exit__(self, *exc):
        self.events.append(("autocast exit",))
        return False


class FakeGradScaler:
    """``torch_gcu.amp.GradScaler``: a plain object with a fixed scale; records its calls."""

    def __init__(self, events, init_scale=2.0**16, use_zero_grad=False, **kwargs):
        self.events = events
        self.scale_value = float(init_scale)
        self.use_zero_grad = use_zero_grad
        self.kwargs = kwargs
        self.unscaled = False

    def scale(self, loss):
        return loss * self.scale_value

    def unscale_(self, optimizer):
        self.events.append(("scaler.unscale_",))
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.div_(self.scale_value)
        self.unscaled = True

    def step(self, optimizer, **kwargs):
        if not self.unscaled:
            self.unscale_(optimizer)
        self.events.append(("scaler.step",))
        return optimizer.step(**kwargs)

    def update(self, new_scale=None):
        self.events.append(("scaler.update", new_scale))
        self.unscaled = False
        if new_scale is not None:
            self.scale_value = float(new_scale)

    def state_dict(self):
        return {"scale": self.scale_value}

    def load_state_dict(self, state):
        self.scale_value = state["scale"]


class FakeTorchGCU1(types.ModuleType):
    """A ``torch_gcu`` 1.x module: cards are ``xla:N``; every call is a recording mock.

    Attributes:
        events: card choices, group creation, graph runs and AMP calls, in order.
        cards: the card state (``cards.current`` is the current card).
        distributed: ``torch_gcu.distributed``, a world of its own (``group.WORLD``).
    """

    def __init__(self, cards=8, current=0, events=None, eccl=True, on_cpu=False, world=1):
        super().__init__("torch_gcu")
        self.events = events if events is not None else []
        self.cards = Cards(current, self.events)
        self.__file__ = "<fake torch_gcu 1.x>"
        self.get_version = mock.Mock(return_value="2.5.136")
        self.is_available = mock.Mock(return_value=cards > 0)
        self.device_count = mock.Mock(return_value=cards)
        self.current_device = mock.Mock(side_effect=self.cards.get)
        self.set_device = mock.Mock(side_effect=self.cards.set)
        self.gcu_device = mock.Mock(
            side_effect=lambda i=None: torch.device("cpu") if on_cpu else torch.device("xla", i)
        )
        self.get_device_name = mock.Mock(return_value="T20")
        self.get_hbm_alloc_size = mock.Mock(return_value=5 * 1024 * 1024)
        self.manual_seed_all = mock.Mock()
        self.JitRunMode = JitRunMode
        self.optimizer_step = mock.Mock(side_effect=self._optimizer_step)
        self.unlazy = mock.Mock(
            side_effect=lambda tensors, mode=None: self.events.append(("unlazy", mode))
        )
        self.collect_amp_training_params = mock.Mock(side_effect=self._amp_params)
        self.collect_buffers = mock.Mock(
            side_effect=lambda model: [b.data for b in model.buffers()]
        )
        self.sync_lived_tensor = mock.Mock(
            side_effect=lambda device=None, mode=None: self.events.append(("sync_lived", mode))
        )
        self.amp = types.ModuleType("torch_gcu.amp")
        self.amp.autocast = mock.Mock(side_effect=lambda **kw: FakeAutocast(self.events, **kw))
        self.amp.GradScaler = mock.Mock(side_effect=lambda **kw: FakeGradScaler(self.events, **kw))
        self.distributed = self._distributed(eccl, world)
        self.nn = types.SimpleNamespace(
            parallel=types.SimpleNamespace(DistributedDataParallel=FakeGCU1DDP)
        )

    def _optimizer_step(
        self, optimizer, extra_output=None, optimizer_args=None, model=None, mode=None, device=None
    ):
        result = optimizer.step(**(optimizer_args or {}))
        self.events.append(("optimizer_step", mode))
        return result

    @staticmethod
    def _amp_params(model, optimizer, scaler):
        return [p for group in optimizer.param_groups for p in group["params"]]

    def _distributed(self, eccl, world):
        gcu_dist = types.ModuleType("torch_gcu.distributed")
        gcu_dist.group = types.SimpleNamespace(WORLD=None)
        gcu_dist.ReduceOp = types.SimpleNamespace(SUM="eccl-sum")
        gcu_dist.is_eccl_available = mock.Mock(return_value=eccl)
        gcu_dist.is_initialized = mock.Mock(side_effect=lambda: gcu_dist.group.WORLD is not None)
        eccl_group = object()

        def init_process_group(backend, **kwargs):
            self.events.append(("eccl init_process_group", backend))
            gcu_dist.group.WORLD = eccl_group

        gcu_dist.init_process_group = mock.Mock(side_effect=init_process_group)
        gcu_dist.get_world_size = mock.Mock(return_value=world)
        gcu_dist.get_backend = mock.Mock(return_value="eccl")
        gcu_dist.all_reduce = mock.Mock()
        gcu_dist.broadcast = mock.Mock()
        return gcu_dist


def install_torch_gcu1(monkeypatch, module):
    """Make ``module`` what ``import torch_gcu`` (and ``torch_gcu.distributed``) gives."""
    monkeypatch.setitem(sys.modules, "torch_gcu", module)
    monkeypatch.setitem(sys.modules, "torch_gcu.distributed", module.distributed)
    monkeypatch.delattr(torch, "gcu", raising=False)
    return module


def gcu1(monkeypatch, cards=8, current=0, events=None, on_cpu=False, eccl=True, jit_mode=None):
    """A ``GCU1Accelerator`` over :class:`FakeTorchGCU1` (``accelerator.torch_gcu``)."""
    module = FakeTorchGCU1(cards, current, events, eccl=eccl, on_cpu=on_cpu)
    install_torch_gcu1(monkeypatch, module)
    return GCU1Accelerator(module, jit_mode)


def gcu1_in_world(monkeypatch, current=0, on_cpu=True):
    """:func:`gcu1` on card ``current`` with its ECCL world made, as a launched rank's is
    after its process groups exist."""
    accelerator = gcu1(monkeypatch, current=current, on_cpu=on_cpu)
    accelerator.torch_gcu.distributed.group.WORLD = object()
    accelerator.adopt_process_groups()
    return accelerator


# -- no torch_gcu -----------------------------------------------------------------------


def cuda(monkeypatch, cards=8, current=0, events=None, on_cpu=False):
    """A ``CUDAAccelerator`` over a mocked torch.cuda; ``torch.cuda.set_device`` records."""
    state = Cards(current, events)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cards)
    monkeypatch.setattr(torch.cuda, "current_device", state.get)
    monkeypatch.setattr(torch.cuda, "set_device", mock.Mock(side_effect=state.set))
    accelerator = CUDAAccelerator()
    if on_cpu:
        _on_cpu(monkeypatch, accelerator)
    return accelerator


def cpu(monkeypatch=None, events=None, on_cpu=False, **_):
    """A ``CPUAccelerator`` (its cards are the CPU already; the arguments are for symmetry)."""
    return CPUAccelerator()


#: The builders by accelerator kind: ``ACCELERATORS[kind](monkeypatch, **kwargs)``.
ACCELERATORS = {"gcu2": gcu2, "gcu1": gcu1, "cuda": cuda, "cpu": cpu}


# -- models ------------------------------------------------------------------------------


class ConvBN(torch.nn.Module):
    """A small model with a BatchNorm (which SyncBN conversion replaces)."""

    def __init__(self, sync=False):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        norm = torch.nn.SyncBatchNorm if sync else torch.nn.BatchNorm2d
        self.bn = norm(4)

    def forward(self, x):
        return self.bn(self.conv(x))


def norm_types(model):
    """The classes of the normalisation layers of ``model``."""
    return [type(m) for m in model.modules() if "Norm" in type(m).__name__]


class ToyModel(BaseModel):
    """An mmengine model: ``forward(inputs, data_samples, mode)``; its loss is ``mean(y**2)``."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, inputs, data_samples=None, mode="tensor"):
        out = self.linear(inputs)
        if mode == "loss":
            return {"loss": out.pow(2).mean()}
        if mode == "predict":
            return [out]
        return out


def toy_batch(n=4):
    return dict(inputs=torch.ones(n, 2))


def record_torch_ddp(monkeypatch):
    """Replace torch DDP's ``__init__`` by a recorder (no process group needed); returns the
    list of the keyword arguments each construction got."""
    calls = []

    def fake_init(self, module, **kwargs):
        torch.nn.Module.__init__(self)
        self.module = module
        calls.append(kwargs)

    monkeypatch.setattr(DistributedDataParallel, "__init__", fake_init)
    return calls
