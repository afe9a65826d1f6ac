"""What each rank of a rehearsal saw, written where ``mmgcu rehearse`` reads it.

The rehearsal config adds this hook (``custom_hooks``); the runner, its loops and the
user's hooks are those of a real job. It reads nothing from a card while the job runs: the
losses are the message hub's (what the log read), and the simulator's counters (card reads,
the lazy graph's runs, compiles and their causes, each card's peak bytes) are host numbers.
Each rank writes ``rehearsal/rank{R}-{stage}.json`` in the work dir after every phase it
reaches, so a rank that fails leaves what it had done; ``stage`` is ``train``, or
``resume`` when the run started from a checkpoint.

With :data:`SEED_EACH_STEP_ENV` set, a card that keeps its seed across steps (an eager
one: S60, CUDA) is seeded anew after each step as a T20 card is (:func:`mmgcu.device.step_seed`),
so that the two generations' rehearsals of a config draw the same random numbers and their
losses can be compared step by step (``make zoo``). A real S60 does not do it.
"""

import json
import numbers
import os
import os.path as osp
import time
from typing import Dict, List, Optional

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from .. import sim
from ..binding import CardBound
from ..device import step_seed
from ..model.whole_graph import changes
from ..runtime.files import write_text_atomically

OUT_DIR = "rehearsal"
#: Set (to 1) in a rehearsal job's environment: eager cards are seeded as a T20's are.
SEED_EACH_STEP_ENV = "MMGCU_REHEARSAL_SEED_EACH_STEP"


def sync_bn_layers(model: torch.nn.Module) -> Dict[str, object]:
    """The model's synchronised batch norms: their classes, count and groups."""
    classes: Dict[str, int] = {}
    groups = set()
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and (
            "Sync" in type(module).__name__
        ):
            classes[type(module).__name__] = classes.get(type(module).__name__, 0) + 1
            group = getattr(module, "process_group", None)
            groups.add("world" if group is None else f"a group of {group.size()} ranks")
    return dict(layers=sum(classes.values()), classes=classes, groups=sorted(groups))


#: mmcv.ops layers that are plain PyTorch in mmcv 2.1.0 (no ``mmcv._ext`` call).
PURE_MMCV_OPS = {
    "CrissCrossAttention": "plain PyTorch in mmcv (einsum, softmax)",
    # multi_scale_deform_attn.py runs multi_scale_deformable_attn_pytorch off CUDA and MLU
    "MultiScaleDeformableAttention": "plain PyTorch off CUDA (multi_scale_deformable_attn_pytorch)",
}


def card_ops(model: torch.nn.Module) -> List[Dict[str, object]]:
    """The model's mmcv ops and how a card runs each: an mmgcu counterpart (its
    ``card_path``), plain PyTorch, or mmcv's compiled op, which has no card kernel."""
    found: Dict[str, Dict[str, object]] = {}
    for module in model.modules():
        cls = type(module)
        if getattr(cls, "card_path", None) is not None:
            name, path = getattr(cls, "mmcv_op", cls.__name__), f"{cls.__name__}: {cls.card_path}"
        elif cls.__module__.startswith("mmcv.ops"):
            name = cls.__name__
            path = PURE_MMCV_OPS.get(name, "mmcv's compiled op: no card kernel")
        else:
            continue
        # a counterpart that computes on the host says so (``host_round_trip = True``)
        cpu = bool(getattr(cls, "host_round_trip", False))
        found.setdefault(name, dict(op=name, path=path, cpu=cpu, count=0))["count"] += 1
    return list(found.values())


def _is_number(value) -> bool:
    # numpy scalars (IoUMetric's float32) are not Python floats
    return isinstance(value, numbers.Number) or getattr(value, "ndim", None) == 0


class Mark:
    """The counters at one moment: card reads, the lazy graph's counters (on a ``lazy``
    card), the index of its next event, the clock."""

    def __init__(self, lazy: bool):
        self.reads = sim.state.host_reads() if sim.is_installed() else 0
        self.graph = sim.graph.counters() if lazy and sim.is_installed() else {}
        self.clock = time.perf_counter()

    def since(self, before: "Mark") -> Dict[str, object]:
        """What happened between ``before`` and this mark."""
        graph = {k: v - before.graph.get(k, 0) for k, v in self.graph.items()}
        out: Dict[str, object] = dict(
            host_reads=self.reads - before.reads, seconds=self.clock - before.clock
        )
        if self.graph:
            runs = {k[len("runs.") :]: v for k, v in graph.items() if k.startswith("runs.")}
            out.update(
                graph_runs=sum(runs.values()),
                graph_runs_by_cause=runs,
                compiles=graph["UncachedCompile"],
                fallbacks={k: v for k, v in graph.items() if k.startswith("aten::") and v},
                cuts=_cuts(sim.graph.events(before.graph["events"])),
            )
        return out


def _cuts(events: List[dict]) -> List[Dict[str, object]]:
    """The graph runs other than the step's own (the last step cut), by what made them and
    where: ``{cause, what, caller, runs, compiles}``."""
    found: Dict[tuple, Dict[str, object]] = {}
    steps = [i for i, e in enumerate(events) if e["cause"] == "step"]
    for i, e in enumerate(events):
        if steps and i == steps[-1]:
            continue
        key = (e["cause"], e["what"], e["caller"])
        entry = found.setdefault(
            key, dict(zip(("cause", "what", "caller"), key), runs=0, compiles=0)
        )
        entry["runs"] += 1
        entry["compiles"] += int(e["compiled"])
    return list(found.values())


@HOOKS.register_module()
class RehearsalHook(CardBound, Hook):
    """Records phases, per-iteration card reads and graph runs, seconds, losses and the
    card's peak memory of one rank of a rehearsal, and what its card is (the device type
    and laziness of the accelerator ``GCURunner`` binds to it)."""

    # After the logger (its read belongs to the iteration), before the checkpoint hook (a
    # save copies every weight to the host once: not a per-iteration cost).
    priority = "LOW"
    off_card = "records no card"

    def __init__(self):
        self.report: Dict[str, object] = dict(phases=[], iterations=[])
        self._mark: Optional[Mark] = None
        self._val_images = 0
        self._lazy = False
        self._step_seed: Optional[int] = None

    # ------------------------------------------------------------------ recording
    def _phase(self, runner, name: str, **facts) -> None:
        self.report["phases"].append(dict(name=name, **facts))
        self._write(runner)

    def _write(self, runner) -> None:
        folder = osp.join(runner.work_dir, OUT_DIR)
        os.makedirs(folder, exist_ok=True)
        stage = self.report.get("stage", "train")
        path = osp.join(folder, f"rank{runner.rank}-{stage}.json")
        write_text_atomically(path, json.dumps(self.report, indent=1))

    # ------------------------------------------------------------------ phases
    def before_run(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        devices = sorted({str(p.device) for p in model.parameters()})
        card = sim.state.current_card() if sim.is_installed() else None
        accelerator = self.card_accelerator()
        self._lazy = accelerator is not None and accelerator.lazy
        self.report.update(
            rank=runner.rank,
            world_size=runner.world_size,
            card=card,
            api=sim.state.api,
            device_type=accelerator.device_type if accelerator is not None else None,
            lazy=self._lazy,
            stage="resume" if runner.cfg.get("resume") else "train",
            param_devices=devices,
            wrapper=type(runner.model).__name__,
            wrapped=is_model_wrapper(runner.model),
            sync_bn=sync_bn_layers(model),
            card_ops=card_ops(model),
            graph_changes=changes(model),
        )
        self._phase(runner, "build")

    def after_load_checkpoint(self, runner, checkpoint) -> None:
        self.report["resumed_from"] = int(checkpoint.get("meta", {}).get("iter", -1))

    def before_train(self, runner) -> None:
        wrapper = runner.optim_wrapper
        dtype = getattr(wrapper, "cast_dtype", None)
        self.report["amp"] = str(dtype).replace("torch.", "") if dtype is not None else None
        self.report["optim_wrapper"] = type(wrapper).__name__
        self.report["start_iter"] = runner.iter
        self._mark = Mark(self._lazy)
        accelerator = self.card_accelerator()
        if os.environ.get(SEED_EACH_STEP_ENV) == "1" and accelerator is not None:
            # GCURunner seeded the cards with the runner's seed, as a T20's chain starts
            self._step_seed = None if accelerator.seeds_each_step else runner.seed
        self._write(runner)

    def _peak(self) -> None:
        """This card's peak bytes so far (a host number), kept should a later phase fail."""
        if sim.is_installed() and self.report.get("card") is not None:
            card = self.report["card"]
            self.report["peak_bytes"] = int(sim.state.ext.max_memory_allocated(card))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        now = Mark(self._lazy)
        entry = dict(iter=runner.iter + 1, **now.since(self._mark))
        self._mark = now
        # The log read this iteration's values (a log line every iteration): the hub's.
        hub = runner.message_hub
        entry["losses"] = {
            key: float(hub.get_scalar(f"train/{key}").current())
            for key in (outputs or {})
            if f"train/{key}" in hub.log_scalars
        }
        self.report["iterations"].append(entry)
        self._peak()
        self._write(runner)
        if self._step_seed is not None:
            self._step_seed = step_seed(self._step_seed)
            self.card_accelerator().manual_seed_all(self._step_seed)

    def after_train(self, runner) -> None:
        self._phase(runner, "train")

    def before_val_epoch(self, runner) -> None:
        self._val_images = 0
        self._val_shapes: List[List[int]] = []
        self._val_mark = Mark(self._lazy)

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self._val_images += len(outputs or ())
        inputs = (data_batch or {}).get("inputs", ()) if isinstance(data_batch, dict) else ()
        # the shapes the test pipeline gave, which a stock model puts on the card as they are
        self._val_shapes += [list(x.shape[-2:]) for x in inputs if hasattr(x, "shape")]

    def after_val_epoch(self, runner, metrics=None) -> None:
        metrics = {k: float(v) for k, v in (metrics or {}).items() if _is_number(v)}
        graph = Mark(self._lazy).since(self._val_mark)
        self._phase(
            runner,
            "val",
            metrics=metrics,
            images=self._val_images,
            input_shapes=self._val_shapes,
            graph=graph,
        )

    def after_run(self, runner) -> None:
        self._peak()
        self._phase(runner, "end")
