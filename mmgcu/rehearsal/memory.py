"""A card's memory in a job of many ranks, from one simulated rank and the model.

At ``--scale real`` one rank measures its card (one simulated card is host memory a card's
size); what each card holds in the configured world that this rank's card does not show is
worked out from the model and the world size, each addition named with how it is computed:

- **The steady step.** A rank that ran one iteration measured it before the optimizer had
  any state: AdamW makes its two moments in the first step, and the gradients stay after it
  where ``zero_grad`` zeroes them in place (torch 1.10's default; torch 2 frees them). Every
  later step holds both through its forward and backward. Unless a later iteration was
  measured at the config's crop and batch, the steady step is iteration 1's peak plus the
  optimizer state and the gradients held after the first step (both measured): an upper
  bound, since at iteration 1's peak some gradients already existed.
- **DDP's gradient buckets** (torch_gcu 1.x): the simulator's DDP reduces one flat bucket
  at a time and keeps none; torch_gcu 1.x's keeps them. Its
  ``torch_gcu/nn/parallel/distributed.py`` (public in GitHub ``mango-MilkT/GCU-PC-share``)
  assigns the gradients to buckets of ``bucket_cap_mb`` (default 256:
  ``bucket_bytes_cap = int(bucket_cap_mb * 1024 * 1024)``,
  ``_compute_bucket_assignment_by_size(parameters, [cap, cap])``), refuses
  ``gradient_as_bucket_view=True`` on a card ("dtu not support `gradient_as_bucket_view`"),
  and hands them to ``Reducer``, whose C++ (in ``_GCUC.so``) is not public. Read
  strictly, as torch 1.10's own ``Reducer::initialize_buckets`` does (one flat ``contents``
  tensor per bucket, allocated once and kept), the buckets hold a second copy of every
  gradient for the whole run. On torch_gcu 2.x DDP is torch's, whose buckets the simulated
  card holds from DDP's construction and measures (``tests/rehearsal/test_memory.py``):
  nothing is added there.
- **DDP's construction broadcast** (torch_gcu 1.x): once, when DDP is built, the weights are
  broadcast in coalesced buffers of up to ``broadcast_bucket_size = 1 GiB``, before the
  buckets exist: the card holds the weights and the larger of the two then.
- **SyncBN across ranks**: with one rank ``GCUSyncBatchNorm`` is plain BatchNorm; with two
  or more it takes its synchronised path (float32 sums, one all-reduce each way, in place),
  which holds more for the layer running: one float32 copy of its input over plain BN for a
  float32 input, five times a float16 input's bytes (measured on the simulator, one layer
  forward and backward: 3 inputs' bytes against 2, and 7 against 2; ``tests/rehearsal/
  test_memory.py`` measures it again). Layers run one at a time: the largest input counts.
- **Not included**: ECCL's own buffers (not public).

:class:`RehearsalMemoryHook` records what this needs on each rank (``memory-rank{R}-
{stage}.json`` in the rehearsal folder); :func:`per_card` does the arithmetic and
:func:`format_lines` prints it.
"""

import json
import os
import os.path as osp
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from .. import sim
from ..binding import CardBound
from ..runtime.files import write_text_atomically

GIB = 1 << 30
MIB = 1 << 20
#: torch_gcu 1.x DDP's default ``bucket_cap_mb``.
TORCH_GCU1_BUCKET_CAP_MB = 256
#: torch_gcu 1.x DDP's ``broadcast_bucket_size``: its construction broadcast's buffers.
TORCH_GCU1_BROADCAST_BYTES = 1 << 30
#: Bytes GCUSyncBatchNorm's synchronised path holds over plain BatchNorm, per input byte
#: of the layer running, by the input's element size (measured: see the module doc).
SYNC_BN_EXTRA_PER_BYTE = {4: 1.0, 2: 5.0}
FOLDER = "rehearsal"


def file_name(rank: int, stage: str) -> str:
    return f"memory-rank{rank}-{stage}.json"


# ---------------------------------------------------------------------------- the model
def gradient_bytes(model: torch.nn.Module) -> Dict[str, int]:
    """Bytes of the gradients of the parameters that take one, by dtype."""
    out: Dict[str, int] = {}
    for p in model.parameters():
        if p.requires_grad:
            key = str(p.dtype).replace("torch.", "")
            out[key] = out.get(key, 0) + p.numel() * p.element_size()
    return out


def bucket_count(sizes: List[int], cap: int) -> int:
    """The buckets ``sizes`` (bytes, in order) fill when a bucket closes once it holds
    ``cap`` bytes or more, as torch's ``_compute_bucket_assignment_by_size`` closes them."""
    count, filled = 0, 0
    for size in sizes:
        filled += size
        if filled >= cap:
            count, filled = count + 1, 0
    return count + (1 if filled else 0)


def ddp_bucket_cap(wrapper: torch.nn.Module) -> Optional[int]:
    """``bucket_bytes_cap`` of the vendor DDP the wrapper holds (``.ddp``) or is."""
    ddp = getattr(wrapper, "ddp", wrapper)
    cap = getattr(ddp, "bucket_bytes_cap", None)
    return int(cap) if cap is not None else None


def _state_bytes(optimizer) -> int:
    """Bytes of the tensors in ``optimizer``'s state (each storage once)."""
    seen, total = set(), 0
    for state in getattr(optimizer, "state", {}).values():
        for value in state.values() if isinstance(state, dict) else ():
            if isinstance(value, torch.Tensor) and value.data_ptr() not in seen:
                seen.add(value.data_ptr())
                total += value.numel() * value.element_size()
    return total


def _held_gradients(model: torch.nn.Module) -> int:
    return sum(
        p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None
    )


def _optimizers(wrapper) -> list:
    """The torch optimizers of an optimizer wrapper (or of each one of a dict of them)."""
    inner = getattr(wrapper, "optim_wrappers", None)
    wrappers = list(inner.values()) if isinstance(inner, dict) else [wrapper]
    return [w.optimizer for w in wrappers if hasattr(w, "optimizer")]


def _sync_bn_extra(shape, element_size: int) -> int:
    numel = 1
    for side in shape:
        numel *= int(side)
    per_byte = SYNC_BN_EXTRA_PER_BYTE.get(element_size, max(SYNC_BN_EXTRA_PER_BYTE.values()))
    return int(numel * element_size * per_byte)


def _is_sync_bn(module: torch.nn.Module) -> bool:
    # as the rehearsal's SyncBN count reads them: torch's, mmcv's and mmgcu's
    return isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and (
        "Sync" in type(module).__name__
    )


# ---------------------------------------------------------------------------- the hook
@HOOKS.register_module()
class RehearsalMemoryHook(CardBound, Hook):
    """Records, on one rank of a rehearsal, what :func:`per_card` needs: the model's
    weights and gradients, DDP's bucket cap and whether the DDP is the vendor's own (the
    accelerator ``GCURunner`` binds to it says), the largest SyncBN input of the first
    iteration, the card's peak after the first and the last iteration, and the optimizer
    state and gradients held after the first step. Reads no card value (sizes, and the
    simulator's counters, which are host numbers)."""

    priority = "LOW"
    off_card = "records no DDP of a GCU card"

    def __init__(self):
        self.facts: Dict[str, object] = dict(iterations=0)
        self._handles: list = []

    def _card_peak(self) -> Optional[int]:
        card = self.facts.get("card")
        if not sim.is_installed() or card is None:
            return None
        return int(sim.state.ext.max_memory_allocated(card))

    def _write(self, runner) -> None:
        folder = osp.join(runner.work_dir, FOLDER)
        os.makedirs(folder, exist_ok=True)
        path = osp.join(folder, file_name(runner.rank, self.facts["stage"]))
        write_text_atomically(path, json.dumps(self.facts, indent=1))

    def before_run(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        tensors = list(model.parameters()) + list(model.buffers())
        cap = ddp_bucket_cap(runner.model) if is_model_wrapper(runner.model) else None
        grads = [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
        loader = runner.cfg.get("train_dataloader") or {}
        self.facts.update(
            rank=runner.rank,
            world_size=runner.world_size,
            stage="resume" if runner.cfg.get("resume") else "train",
            api=sim.state.api if sim.is_installed() else None,
            card=sim.state.current_card() if sim.is_installed() else None,
            batch_size=loader.get("batch_size"),
            weights_bytes=sum(t.numel() * t.element_size() for t in tensors),
            gradients=gradient_bytes(model),
            bucket_cap=cap,
            buckets=bucket_count(grads[::-1], cap) if cap else None,
            vendor_ddp=self._vendor_ddp(),
            sync_bn=dict(layers=0, largest=None),
        )
        for name, module in model.named_modules():
            if _is_sync_bn(module):
                self.facts["sync_bn"]["layers"] += 1
                self._handles.append(module.register_forward_pre_hook(self._sync_bn_input(name)))
        self._write(runner)

    def _vendor_ddp(self) -> bool:
        """Whether the job's DDP is the vendor's own class, not torch's (torch_gcu 1.x's,
        whose buckets the simulated one does not hold)."""
        accelerator = self.card_accelerator()
        ddp = torch.nn.parallel.DistributedDataParallel
        return accelerator is not None and accelerator.vendor_ddp() is not ddp

    def _sync_bn_input(self, name: str):
        def record(module, inputs):
            x = inputs[0]
            extra = _sync_bn_extra(x.shape, x.element_size())
            largest = self.facts["sync_bn"]["largest"]
            if module.training and (largest is None or extra > largest["extra_bytes"]):
                self.facts["sync_bn"]["largest"] = dict(
                    layer=name,
                    shape=list(x.shape),
                    dtype=str(x.dtype).replace("torch.", ""),
                    extra_bytes=extra,
                )

        return record

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.facts["iterations"] += 1
        entry = dict(iter=runner.iter + 1, peak_bytes=self._card_peak())
        if self.facts["iterations"] == 1:
            model = runner.model.module if is_model_wrapper(runner.model) else runner.model
            entry["state_bytes"] = sum(_state_bytes(o) for o in _optimizers(runner.optim_wrapper))
            entry["gradients_held"] = _held_gradients(model)
            self.facts["first"] = entry
            for handle in self._handles:  # one iteration shows every SyncBN input shape
                handle.remove()
            self._handles = []
        self.facts["last"] = entry
        self._write(runner)

    def after_run(self, runner) -> None:
        self.facts["peak_bytes"] = self._card_peak()
        self._write(runner)


def read(work_dir: str, rank: int, stage: str) -> Optional[dict]:
    """What :class:`RehearsalMemoryHook` wrote for ``rank`` and ``stage``, or None."""
    try:
        with open(osp.join(work_dir, FOLDER, file_name(rank, stage))) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------- arithmetic
def steady_step(facts: dict) -> Optional[dict]:
    """The step after the first, per card: measured where the job ran two or more
    iterations, else iteration 1's peak plus the optimizer state and the gradients held
    after the first step (see the module doc). None without a first iteration."""
    first = facts.get("first") or {}
    if first.get("peak_bytes") is None:
        return None
    if facts.get("iterations", 0) >= 2:
        last = facts["last"]
        return dict(measured=True, bytes=last["peak_bytes"], through=last["iter"])
    parts = dict(
        first_peak=first["peak_bytes"],
        state=first.get("state_bytes", 0),
        gradients=first.get("gradients_held", 0),
    )
    return dict(parts, measured=False, bytes=sum(parts.values()))


def ddp_additions(facts: dict) -> List[dict]:
    """What the vendor's DDP (torch_gcu 1.x's) holds on a card that the simulator's does
    not: its buckets in every step, and once, when it is built, its broadcast buffers.
    Nothing for torch's own DDP, whose buckets the simulated card holds and measures."""
    if not facts.get("vendor_ddp") or not facts.get("bucket_cap"):
        return []
    grads = sum((facts.get("gradients") or {}).values())
    cap, weights = facts["bucket_cap"], facts.get("weights_bytes", 0)
    broadcast = min(TORCH_GCU1_BROADCAST_BYTES, weights)
    return [
        dict(
            name="DDP gradient buckets",
            when="step",
            bytes=grads,
            how=f"torch_gcu 1.x DDP keeps {facts.get('buckets')} bucket(s) of up to "
            f"{cap / MIB:g} MiB (bucket_cap_mb), a flat copy of every gradient "
            "(gradient_as_bucket_view=False on a card); the simulator's DDP keeps none",
        ),
        dict(
            name="DDP construction",
            when="once",
            bytes=weights + max(broadcast, grads),
            how=f"when DDP is built: the weights, {_gib(weights)}, and the larger of its "
            f"broadcast buffer, {_gib(broadcast)} (broadcast_bucket_size: 1 GiB at most), "
            "and the buckets",
        ),
    ]


def sync_bn_addition(facts: dict, world: int) -> Optional[dict]:
    """What SyncBN's synchronised path adds on a card of a ``world``-rank job, when the
    measured rank ran without it (one rank: plain BatchNorm); None otherwise."""
    largest = (facts.get("sync_bn") or {}).get("largest")
    if world < 2 or facts.get("world_size", 1) >= 2 or not largest:
        return None
    shape = "x".join(str(s) for s in largest["shape"])
    return dict(
        name=f"SyncBN across {world} ranks",
        when="step",
        bytes=largest["extra_bytes"],
        how="GCUSyncBatchNorm's synchronised path over plain BN, for the layer running "
        f"(the largest input: {largest['layer']}, {shape} {largest['dtype']})",
    )


@dataclass
class MemoryFigure:
    """The memory of one card of a ``world``-rank job (:func:`per_card`): rank ``card``'s
    ``batch_size`` images, its measured peak, the steady step (:func:`steady_step`), each
    addition (``{name, when: 'step' or 'once', bytes, how}``), the step's bytes and the
    total, against the card's memory."""

    world: int
    card: Optional[int]
    batch_size: Optional[int]
    measured_peak: int
    steady: dict
    additions: List[dict]
    step_bytes: int
    total_bytes: int
    card_memory_bytes: int
    fits: bool


def per_card(
    train: dict, measured_peak: int, world: int, card_memory: int
) -> Optional[MemoryFigure]:
    """The memory of one card of a ``world``-rank job: the larger of the measured peak
    (``measured_peak``, every phase of every job) and the steady step (:func:`steady_step`
    of the ``train`` job's facts), plus each addition (:func:`ddp_additions`,
    :func:`sync_bn_addition`); a once-only addition counts where it is larger."""
    steady = steady_step(train)
    if steady is None:
        return None
    base = max(measured_peak, steady["bytes"])
    sync_bn = sync_bn_addition(train, world)
    additions = ddp_additions(train) + ([sync_bn] if sync_bn else [])
    step = base + sum(a["bytes"] for a in additions if a["when"] == "step")
    total = max([step] + [a["bytes"] for a in additions if a["when"] == "once"])
    return MemoryFigure(
        world=world,
        card=train.get("card"),
        batch_size=train.get("batch_size"),
        measured_peak=measured_peak,
        steady=steady,
        additions=additions,
        step_bytes=step,
        total_bytes=total,
        card_memory_bytes=card_memory,
        fits=total <= card_memory,
    )


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def format_lines(memory: Optional[MemoryFigure]) -> List[str]:
    """The per-card figure as the report prints it."""
    if memory is None:
        return []
    steady = memory.steady
    out = [
        f"  memory per card for {memory.world} rank(s), {memory.batch_size} image(s) "
        f"each (one rank measured on card {memory.card}; what the others add, worked out):",
        f"    measured peak, every phase: {_gib(memory.measured_peak)}",
    ]
    if steady["measured"]:
        out.append(f"    steady step, measured through iteration {steady['through']}")
    else:
        out.append(
            f"    steady step, worked out: {_gib(steady['bytes'])} = iteration 1's peak "
            f"{_gib(steady['first_peak'])} + optimizer state {_gib(steady['state'])} + "
            f"gradients {_gib(steady['gradients'])} (measured after the first step; each "
            "later step holds both through forward and backward: an upper bound)"
        )
    for a in memory.additions:
        if a["when"] == "step":
            out.append(f"    + {a['name']}: {_gib(a['bytes'])} ({a['how']})")
        else:  # counted where it is more than the step's figure
            out.append(f"    {a['name']}, once: {_gib(a['bytes'])} in all ({a['how']})")
    out.append("    not included: ECCL's own buffers (not public)")
    verdict = "fits" if memory.fits else "DOES NOT FIT"
    out.append(
        f"    = {_gib(memory.total_bytes)} per card of {_gib(memory.card_memory_bytes)}: {verdict}"
    )
    return out
