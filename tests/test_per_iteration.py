"""Per-iteration work audit: after the first iteration, mmgcu adds no work to a step.

A short training of the tiny config runs on one simulated card (v2 and legacy) in a
fresh process, under a ``sys.setprofile`` (and ``threading.setprofile``) counter of the
Python calls into functions whose code lives in the ``mmgcu/`` package. A marker hook at
``LOWEST`` priority cuts the run into segments: iteration k is everything from the end of
iteration k-1's ``after_*_iter`` hooks to the end of its own, so the loop's own work (data
fetch, ``GCUValLoop.run_iter``, which itself calls the ``*_iter`` hooks) is inside it.

Asserted, for training iterations and validation iterations alike:

- from iteration 2 on, the plugin functions called per iteration are exactly the expected
  minimal set with the expected count each (train: the optimizer-step path
  ``GCUOptimWrapper.step -> _step -> get_backend -> backend.optimizer_step``; validation:
  ``GCUValLoop.run_iter -> _autocast``), the same in every iteration (no growth);
- iteration 1 calls strictly more: the one-time first-batch check of
  ``GCURunner._check_first_batch`` (a forward hook that removes itself);
- ``GCUDevicePlacementHook`` runs before the loops, never inside an iteration.

Calls into ``mmgcu/sim/`` are the fake vendor library (what torch_gcu itself would do),
counted separately: on legacy exactly one ``torch_gcu.optimizer_step`` per training
iteration, on v2 none. The logger interval is 1000 and the train set (16 images, 2 per
batch) is longer than the run, so no log line (and no ``GCULogProcessor`` call) falls in an
iteration; logging iterations would add the log processor's calls by design.

The same child also trains once more with a hook that calls mmgcu each iteration (a
"per-iteration placement check"), and the audit must flag it: the test can fail.
"""

import json

import pytest

from tests.conftest import run_python
from tests.e2e.conftest import TINY, dataset  # noqa: F401  (the session's synthetic dataset)

ITERS = 5
VAL_ITERS = 3

CHILD = r"""
import inspect
import json
import os
import sys
import threading

import mmgcu  # installs the simulated torch_gcu (MMGCU_SIMULATE=1)
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import HOOKS, RUNNERS

TINY, DATA, WORK, ITERS, VAL_ITERS = json.loads(os.environ["PER_ITERATION_AUDIT"])
PKG = os.path.dirname(mmgcu.__file__)
ROOT = os.path.dirname(PKG)


def qualnames():
    # code object -> qualified name, for the plugin's functions and methods (co_qualname
    # exists only from Python 3.11; closures fall back to it or to co_name).
    names = {}
    for name, module in list(sys.modules.items()):
        if not (name == "mmgcu" or name.startswith("mmgcu.")) or module is None:
            continue
        for obj in list(vars(module).values()):
            members = [obj]
            if inspect.isclass(obj) and obj.__module__ == name:
                members = [
                    getattr(v, "__func__", getattr(v, "fget", v)) for v in vars(obj).values()
                ]
            for fn in members:
                fn = inspect.unwrap(fn) if callable(fn) else fn
                code = getattr(fn, "__code__", None)
                if code is not None and code.co_filename.startswith(PKG):
                    names[code] = fn.__qualname__
    return names


class Audit:
    def __init__(self):
        self.segment = "setup"
        self.counts = {}
        self.keys = {}
        self.names = qualnames()

    def profile(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        key = self.keys.get(code, 0)
        if key == 0:
            key = None
            if code.co_filename.startswith(PKG):
                name = self.names.get(code) or getattr(code, "co_qualname", code.co_name)
                path = os.path.relpath(code.co_filename, ROOT).replace(os.sep, "/")
                key = f"{path}:{name}"
            self.keys[code] = key
        if key is not None:
            seg = self.counts.setdefault(self.segment, {})
            seg[key] = seg.get(key, 0) + 1


audit = Audit()


@HOOKS.register_module()
class IterationMarks(Hook):
    # LOWEST: a segment ends after every other hook of the iteration.
    priority = "LOWEST"

    def before_train(self, runner):
        audit.segment = "train:1"

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        done = runner.iter + 1  # the loop counts the iteration after its hooks
        audit.segment = "train:after" if done == ITERS else f"train:{done + 1}"

    def before_val(self, runner):
        audit.segment = "val:1"

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        done = batch_idx + 1
        audit.segment = "val:after" if done == VAL_ITERS else f"val:{done + 1}"


@HOOKS.register_module()
class PerIterationCheck(Hook):
    # What the audit must catch: a plugin check run in every iteration.
    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        from mmgcu.device import get_backend
        from mmgcu.model.wrappers import misplaced

        assert not misplaced(runner.model, get_backend().device())


def train(name, hooks):
    cfg = Config.fromfile(TINY)
    cfg.work_dir = os.path.join(WORK, name)
    cfg.experiment_name = name
    for loader in (cfg.train_dataloader, cfg.val_dataloader):
        loader.dataset.data_root = DATA
    cfg.val_dataloader.dataset.indices = VAL_ITERS
    cfg.test_dataloader = cfg.val_dataloader
    cfg.train_cfg = dict(type="IterBasedTrainLoop", max_iters=ITERS, val_interval=ITERS)
    cfg.default_hooks.logger.interval = 1000
    cfg.default_hooks.checkpoint = dict(type="CheckpointHook", interval=1000, save_last=False)
    cfg.custom_hooks = [dict(type=h) for h in hooks]
    runner = RUNNERS.build(cfg)
    audit.__init__()
    sys.setprofile(audit.profile)
    threading.setprofile(audit.profile)
    try:
        runner.train()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return dict(
        segments=audit.counts,
        optim_wrapper=type(runner.optim_wrapper).__name__,
        backend=mmgcu.get_backend().name,
    )


runs = {
    "clean": train("clean", ["IterationMarks"]),
    "injected": train("injected", ["IterationMarks", "PerIterationCheck"]),
}
print(json.dumps(runs))
"""

OPTIM_STEP = {
    "mmgcu/optim/wrappers.py:GCUOptimWrapper.step": 1,
    "mmgcu/optim/wrappers.py:_step": 1,
    "mmgcu/device/__init__.py:get_backend": 1,
}
# Plugin calls per iteration from the 2nd on, and the fake vendor's (mmgcu/sim/) calls.
EXPECTED = {
    "v2": {
        "train": dict(OPTIM_STEP, **{"mmgcu/device/base.py:DeviceBackend.optimizer_step": 1}),
        "train_vendor": {},
    },
    "legacy": {
        "train": dict(OPTIM_STEP, **{"mmgcu/device/legacy.py:GcuLegacyBackend.optimizer_step": 1}),
        "train_vendor": {"mmgcu/sim/legacy.py:optimizer_step": 1},
    },
}
EXPECTED_VAL = {"mmgcu/loops.py:GCUValLoop.run_iter": 1, "mmgcu/loops.py:_autocast": 1}
FIRST_BATCH_CHECK = "mmgcu/runner.py:_check_first_batch.<locals>.check"
PLACEMENT = "mmgcu/hooks/placement.py:GCUDevicePlacementHook."


def split(counts):
    """``counts`` as (plugin calls, fake-vendor calls)."""
    plugin = {k: n for k, n in counts.items() if not k.startswith("mmgcu/sim/")}
    vendor = {k: n for k, n in counts.items() if k.startswith("mmgcu/sim/")}
    return plugin, vendor


def audit(segments, api):
    """What is wrong with one run's per-segment call counts (empty: nothing)."""
    problems = []
    iters = [segments.get(f"train:{k}", {}) for k in range(1, ITERS + 1)]
    vals = [segments.get(f"val:{k}", {}) for k in range(1, VAL_ITERS + 1)]
    for k, counts in enumerate(iters[1:], 2):
        plugin, vendor = split(counts)
        if plugin != EXPECTED[api]["train"]:
            problems.append(f"train iteration {k}: plugin calls {plugin}")
        if vendor != EXPECTED[api]["train_vendor"]:
            problems.append(f"train iteration {k}: vendor calls {vendor}")
    for k, counts in enumerate(vals, 1):
        if counts != EXPECTED_VAL:
            problems.append(f"val iteration {k}: calls {counts}")
    first, _ = split(iters[0])
    second, _ = split(iters[1])
    if FIRST_BATCH_CHECK not in first:
        problems.append(f"iteration 1 ran no first-batch check: {first}")
    if not (sum(first.values()) > sum(second.values()) and set(second) <= set(first)):
        problems.append(f"iteration 1 ({first}) does not call more than iteration 2")
    for k, counts in enumerate(iters, 1):
        if any(key.startswith(PLACEMENT) for key in counts):
            problems.append(f"train iteration {k} calls the placement hook: {counts}")
    # The profiler saw the plugin at all: the placement check ran before the loop.
    if not any(key.startswith(PLACEMENT) for key in segments.get("setup", {})):
        problems.append(f"no placement check before the loop: {segments.get('setup')}")
    return problems


@pytest.mark.parametrize("api", ["v2", "legacy"])
def test_no_per_iteration_work_after_the_first(api, dataset, tmp_path):  # noqa: F811
    proc = run_python(
        CHILD,
        timeout=300,
        PER_ITERATION_AUDIT=json.dumps([TINY, dataset, str(tmp_path), ITERS, VAL_ITERS]),
        MMGCU_SIMULATE=1,
        MMGCU_SIMULATE_API=api,
        OMP_NUM_THREADS=1,
    )
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    clean = runs["clean"]
    assert clean["backend"] == api and clean["optim_wrapper"] == "GCUOptimWrapper", clean
    problems = audit(clean["segments"], api)
    assert not problems, "\n".join(problems) + "\n" + json.dumps(clean["segments"], indent=1)
    # The same audit catches a plugin check added to every iteration.
    injected = audit(runs["injected"]["segments"], api)
    assert any(p.startswith("train iteration 2:") for p in injected), injected
