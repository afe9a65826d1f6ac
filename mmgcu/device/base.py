"""What every kind of device offers the rest of mmgcu.

The runner, wrappers, hooks and tools talk to an :class:`Accelerator` and never to
torch_gcu. Each torch_gcu generation, CUDA and the CPU is one subclass; the runner picks
one (:func:`mmgcu.device.select_accelerator`) and hands it to what it builds.
"""

from typing import Any, Dict, Optional, Tuple

import torch

from ..errors import GCUError


def simulated(torch_gcu) -> bool:
    """Whether the ``torch_gcu`` module is mmgcu's simulator (it registers its own package
    under that name, so the module's real name says so)."""
    return getattr(torch_gcu, "__name__", "").startswith("mmgcu.sim.")


class CardGroup:
    """The process group that carries card tensors, with the collectives of its world.

    On torch_gcu 2.x, CUDA and the CPU that is torch.distributed's default group; on
    torch_gcu 1.x it is a group of torch_gcu.distributed, a world of its own.

    On torch.distributed's default group over gloo a small sum goes to rank 0, which adds
    the parts in rank order and broadcasts the result (the same bytes on every rank): gloo's
    ring takes ``2 (n - 1)`` steps for an all-reduce and ``n - 1`` for an all-gather, a
    gather and a broadcast two. 129 floats on 2 CPU ranks: 1.4 ms by all-reduce, 0.8 by
    all-gather, 0.5 through rank 0; on 4 ranks of 2 cores 6.4, 3.9 and 1.7. SyncBN's
    per-channel sums are that small. Other groups and backends (ECCL, NCCL) keep their own
    all-reduce.

    Args:
        dist: the ``torch.distributed``-like module the group belongs to.
        group: the group, or None for that module's default group.
        name: how logs and errors call it (``'torch.distributed gloo'``, ...).
    """

    #: Up to this many gathered elements (the tensor's times the world size) a sum over
    #: gloo goes through rank 0; SyncBN's 2C+1 for C <= 2048 on 8 ranks is 32776.
    GLOO_GATHER_LIMIT = 1 << 15

    def __init__(self, dist, group=None, name: str = ""):
        self.dist = dist
        self.group = group
        self.name = name or f"{dist.__name__} {dist.get_backend(group)}"
        self._backend = None

    @property
    def world_size(self) -> int:
        return self.dist.get_world_size(self.group)

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over the group, in place."""
        if not self._sums_through_root(tensor):
            self.dist.all_reduce(tensor, self.dist.ReduceOp.SUM, group=self.group)
            return
        # A collective, as dist.all_reduce is, not an autograd op.
        with torch.no_grad():
            if self.dist.get_rank() == 0:
                parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
                self.dist.gather(tensor, parts, dst=0)
                tensor.copy_(torch.stack(parts).sum(0))
            else:
                self.dist.gather(tensor, None, dst=0)
            self.dist.broadcast(tensor, 0)

    def _sums_through_root(self, tensor: torch.Tensor) -> bool:
        """Whether a sum of ``tensor`` goes through rank 0: a small, dense CPU tensor on
        the default group over gloo (whose rank 0 is the global rank 0)."""
        if self.group is not None:
            return False
        if tensor.device.type != "cpu" or tensor.layout != torch.strided:
            return False  # a card tensor, or a sparse one: the backend's all-reduce
        if not tensor.is_contiguous():
            return False
        if self._backend is None:
            self._backend = str(self.dist.get_backend(self.group))
        if self._backend != "gloo":
            return False
        return tensor.numel() * self.world_size <= self.GLOO_GATHER_LIMIT

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        self.dist.broadcast(tensor, src, group=self.group)

    def __deepcopy__(self, memo):
        return self  # a process group belongs to the process: copies (an EMA model) share it

    def __repr__(self) -> str:
        return f"CardGroup({self.name}, world_size={self.world_size})"


def step_seed(seed: int) -> int:
    """The card seed that follows ``seed`` at a step marker of an XLA card: torch_xla's
    ``MarkStep`` (v1.10 ``torch_xla/csrc/tensor.cpp``: ``seed = 1012031 + seed * 7012063``),
    kept in 32 bits, the range of torch_gcu 1.x's ``manual_seed_all``."""
    return (1012031 + 7012063 * int(seed)) % 2**32


class Accelerator:
    """The device operations mmgcu needs, for one kind of device.

    Attributes:
        kind: ``'gcu2'`` (torch_gcu 2.x), ``'gcu1'`` (torch_gcu 1.x), ``'cuda'`` or ``'cpu'``.
        device_type: the ``torch.device`` type of a card (``'gcu'``, ``'xla'``, ...).
        is_gcu: whether the cards are Enflame GCUs.
        description: one line saying what was found (logged, printed by ``mmgcu env``).
        default_pg_backend: backend of torch.distributed's default group. mmengine's own
            collectives use that group and send CPU tensors for backends it does not
            know, so it must carry CPU tensors.
        other_pg_backends: other backends a config may give the default group here.
        amp_dtypes: the dtypes autocast supports here.
        card_group: the :class:`CardGroup` for card tensors, once process groups exist.
        simulated: whether torch_gcu is mmgcu's simulator (:mod:`mmgcu.sim`).
    """

    kind = "base"
    device_type = "cpu"
    is_gcu = False
    #: Whether the card records ops into a graph that runs later and compiles each graph it
    #: has not seen (torch_gcu 1.x: XLA devices). mmgcu keeps such a card's step to one
    #: graph and its validation to a few shapes (:mod:`mmgcu.model.whole_graph`).
    lazy = False
    #: Whether the accelerator seeds the cards anew after each step by itself
    #: (:func:`step_seed`; torch_gcu 1.x, whose step is not a step marker).
    seeds_each_step = False
    #: Whether the card keeps freed memory in a cache that :meth:`empty_cache` gives back.
    caches_memory = False
    #: Whether cuDNN runs the card's convolutions (``env_cfg.cudnn_benchmark`` is for it).
    cudnn = False
    #: Whether torch's own ``SyncBatchNorm`` runs on the cards (it has CUDA kernels only);
    #: elsewhere mmgcu's ``GCUSyncBatchNorm`` synchronises over the card group.
    torch_sync_bn = False
    description = ""
    default_pg_backend = "gloo"
    other_pg_backends: Tuple[str, ...] = ()
    amp_dtypes: tuple = ()
    #: Whether the cards are mmgcu's simulated ones (torch_gcu is ``mmgcu.sim``'s).
    simulated = False

    def __init__(self):
        self.card_group: Optional[CardGroup] = None

    # -- cards -----------------------------------------------------------------
    def is_available(self) -> bool:
        raise NotImplementedError

    def device_count(self) -> int:
        raise NotImplementedError

    def current_device(self) -> int:
        raise NotImplementedError

    def set_device(self, index: int) -> None:
        raise NotImplementedError

    def device(self, index: Optional[int] = None) -> torch.device:
        """The ``torch.device`` of card ``index`` (default: the current card)."""
        return torch.device(self.device_type, self.current_device() if index is None else index)

    def device_name(self, index: int = 0) -> str:
        return self.device_type

    # -- memory --------------------------------------------------------------------
    def peak_memory(self, index: int) -> Optional[int]:
        """Bytes for the log's ``memory`` column (the peak since the last call, where the
        kind counts a peak), or None where it cannot tell."""
        return None

    @property
    def memory_source(self) -> str:
        """What the ``memory`` column shows on this kind, or why there is none."""
        return "none: this device reports no memory statistics"

    def empty_cache(self) -> bool:
        """Give cached card memory back; False where the kind has no cache to empty
        (:attr:`caches_memory`)."""
        return False

    # -- randomness ------------------------------------------------------------------
    def manual_seed_all(self, seed: int) -> None:
        """Seed every card's generator (torch.manual_seed already seeds the CPU)."""

    # -- distribution ----------------------------------------------------------------
    def check_collectives(self) -> None:
        """Raise :class:`GCUError` when the card collectives are not available."""

    def init_process_groups(self, pg_backend: str, **kwargs) -> CardGroup:
        """Create torch.distributed's default group (and any card group); return the
        card group. ``kwargs`` go to ``init_process_group`` (timeout, ...)."""
        import torch.distributed as dist

        dist.init_process_group(backend=pg_backend, **kwargs)
        self.card_group = CardGroup(dist, None, f"torch.distributed {dist.get_backend()}")
        return self.card_group

    def adopt_process_groups(self) -> CardGroup:
        """The card group when the caller created torch.distributed's group itself."""
        import torch.distributed as dist

        self.card_group = CardGroup(dist, None, f"torch.distributed {dist.get_backend()}")
        return self.card_group

    def ddp_kwargs(self, card: int) -> Dict[str, Any]:
        """The device arguments of this kind's DDP for card ``card``."""
        return {}

    def vendor_ddp(self) -> type:
        """This kind's DistributedDataParallel class: torch's, unless the vendor has its own
        (the DDP wrapper that stands in for mmengine's is chosen by it)."""
        return torch.nn.parallel.DistributedDataParallel

    # -- precision ---------------------------------------------------------------------
    def autocast(self, dtype: torch.dtype = torch.float16, enabled: bool = True):
        raise GCUError(f"mixed precision is not available on {self.kind} ({self.description})")

    #: What an overflowed AMP step does on this kind, the default first: ``'skip'`` (torch's
    #: GradScaler: the optimizer does not step; deciding it reads the card once per step)
    #: or ``'zero'`` (torch_gcu 1.x's ``use_zero_grad``: it steps with zero gradients, no read).
    overflow_steps: Tuple[str, ...] = ()

    def grad_scaler(self, overflow_step: Optional[str] = None, **kwargs):
        """The kind's GradScaler; ``overflow_step`` one of :attr:`overflow_steps` (None: the
        first). ``kwargs`` are GradScaler's (``init_scale``, ``growth_interval``, ...)."""
        raise GCUError(f"a GradScaler is not available on {self.kind} ({self.description})")

    def _overflow_step(self, overflow_step: Optional[str]) -> str:
        if overflow_step is None:
            return self.overflow_steps[0]
        if overflow_step not in self.overflow_steps:
            raise GCUError(
                f"optim_wrapper overflow_step={overflow_step!r} is not available on {self.kind} "
                f"({self.description}): use one of {list(self.overflow_steps)}"
            )
        return overflow_step

    # -- the step ----------------------------------------------------------------------
    def optimizer_step(self, optimizer, model=None, loss=None, **kwargs) -> None:
        """One optimizer step; a lazy device also runs its graph here (once per step)."""
        optimizer.step(**kwargs)

    def after_amp_step(self, optimizer, model, scaler, loss) -> None:
        """What follows ``scaler.step``/``update`` on this kind (a lazy graph run on 1.x)."""

    def finish_step(self, extra=()) -> None:
        """The end of an iteration's work on the card. A lazy card runs the iteration's
        graph here, with ``extra`` (card tensors the host will read of this iteration)
        among its outputs, so that reading them later is a transfer, not another graph."""

    def compiled_graphs(self) -> Optional[int]:
        """How many graphs the card compiled in this process, where the kind reports it
        (a lazy card's compile counter); None where it cannot tell."""
        return None

    # -- reporting -----------------------------------------------------------------------
    def summary(self) -> Dict[str, Any]:
        """What this accelerator found, for logs and ``mmgcu env``."""
        return {
            "kind": self.kind,
            "device_type": self.device_type,
            "description": self.description,
            "available": self.is_available(),
            "cards": self.device_count() if self.is_available() else 0,
            "process_groups": self.default_pg_backend,
            "memory": self.memory_source,
        }
