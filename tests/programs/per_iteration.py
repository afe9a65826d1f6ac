"""Count the calls into mmgcu, per source file, in each iteration of a short training.

Usage: ``per_iteration.py TINY_CONFIG DATA_ROOT WORK_DIR ITERS VAL_ITERS`` with
``MMGCU_SIMULATE=1`` and ``MMGCU_SIMULATE_API=gcu2|gcu1``. Trains the tiny config twice on
one simulated card: once as it is ("clean") and once with a hook that calls mmgcu in every
iteration ("injected", what an audit must catch). Prints one JSON line:
``{run: {"segments": {segment: {file: calls}}, "graph_runs": {segment: n}, ...}}``.

A ``sys.setprofile`` (and ``threading.setprofile``) counter sees every Python call whose
code lives in the ``mmgcu/`` package, keyed by its file relative to the repository. A marker
hook at ``LOWEST`` priority cuts the run into segments: ``setup`` (before the loop),
``train:k`` (from the end of iteration k-1's ``after_train_iter`` hooks to the end of its
own), ``val:k`` likewise, then ``train:after`` / ``val:after``. ``graph_runs`` are the lazy
graphs the simulated torch_gcu 1.x's card ran in each segment (none on 2.x).
"""

import json
import os
import sys
import threading

from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import HOOKS, RUNNERS

import mmgcu  # installs the simulated torch_gcu (MMGCU_SIMULATE=1)
from mmgcu.sim import graph

TINY, DATA, WORK = sys.argv[1:4]
ITERS, VAL_ITERS = int(sys.argv[4]), int(sys.argv[5])
PACKAGE = os.path.dirname(os.path.abspath(mmgcu.__file__))
ROOT = os.path.dirname(PACKAGE)


class Audit:
    def __init__(self):
        self.segment = "setup"
        self.calls = {}
        self.graph_runs = {}
        self.files = {}  # code object -> its file relative to the repository, or None

    def enter(self, segment):
        runs = graph.graph_runs(graph.counters())
        self.graph_runs[self.segment] = runs - self.graphs_before
        self.segment = segment
        self.graphs_before = runs

    def start(self):
        self.graphs_before = graph.graph_runs(graph.counters())

    def profile(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        path = self.files.get(code, 0)
        if path == 0:
            name = os.path.abspath(code.co_filename)
            inside = name.startswith(PACKAGE + os.sep)
            path = os.path.relpath(name, ROOT).replace(os.sep, "/") if inside else None
            self.files[code] = path
        if path is not None:
            counts = self.calls.setdefault(self.segment, {})
            counts[path] = counts.get(path, 0) + 1


audit = Audit()


@HOOKS.register_module()
class IterationMarks(Hook):
    # LOWEST: a segment ends after every other hook of the iteration.
    priority = "LOWEST"

    def before_train(self, runner):
        audit.enter("train:1")

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        done = runner.iter + 1  # the loop counts the iteration after its hooks
        audit.enter("train:after" if done == ITERS else f"train:{done + 1}")

    def before_val(self, runner):
        audit.enter("val:1")

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        done = batch_idx + 1
        audit.enter("val:after" if done == VAL_ITERS else f"val:{done + 1}")


@HOOKS.register_module()
class PerIterationCheck(Hook):
    """What the audit must catch: a placement check of mmgcu's run in every iteration."""

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        from mmgcu.model.placement import misplaced

        assert not misplaced(runner.model, runner.accelerator.device())


def train(name, hooks):
    cfg = Config.fromfile(TINY)
    cfg.work_dir = os.path.join(WORK, name)
    cfg.experiment_name = name
    for loader in (cfg.train_dataloader, cfg.val_dataloader):
        loader.dataset.data_root = DATA
    cfg.val_dataloader.dataset.indices = VAL_ITERS
    cfg.test_dataloader = cfg.val_dataloader
    cfg.train_cfg = dict(type="IterBasedTrainLoop", max_iters=ITERS, val_interval=ITERS)
    # No log line and no checkpoint inside the audited iterations: the logger's interval
    # and the checkpoint's are longer than the run.
    cfg.default_hooks.logger.interval = 1000
    cfg.default_hooks.checkpoint = dict(type="CheckpointHook", interval=1000, save_last=False)
    cfg.custom_hooks = [dict(type=h) for h in hooks]
    runner = RUNNERS.build(cfg)
    audit.__init__()
    audit.start()
    sys.setprofile(audit.profile)
    threading.setprofile(audit.profile)
    try:
        runner.train()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    audit.enter("end")
    return dict(
        segments=audit.calls,
        graph_runs=audit.graph_runs,
        optim_wrapper=type(runner.optim_wrapper).__name__,
        val_loop=type(runner.val_loop).__name__,
        kind=runner.accelerator.kind,
    )


runs = {
    "clean": train("clean", ["IterationMarks"]),
    "injected": train("injected", ["IterationMarks", "PerIterationCheck"]),
}
print(json.dumps(runs))
