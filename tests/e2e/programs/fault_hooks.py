"""Hooks the fault tests' configs import (this folder is put on PYTHONPATH): each injects
one fault into a real training job, or records what the job did, in files of its work dir.
"""

import os
import signal
import time

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


def _mark(runner, name: str) -> None:
    with open(os.path.join(runner.work_dir, f"{name}_rank{runner.rank}"), "w") as f:
        f.write(str(time.time()))


@HOOKS.register_module()
class PidHook(Hook):
    """Every rank writes its pid to ``pid_rankR`` before training."""

    def before_train(self, runner):
        with open(os.path.join(runner.work_dir, f"pid_rank{runner.rank}"), "w") as f:
            f.write(str(os.getpid()))


@HOOKS.register_module()
class FaultHook(PidHook):
    """After train iteration ``at`` (1-based), rank ``rank`` (None: every rank) fails.

    Modes: ``exit`` (exit code 3), ``raise``, ``sleep`` (until the test kills it), ``kill``
    (SIGKILL itself), ``mark`` (only writes ``fault_rankR``, for a fault the test injects).
    ``once``: not again where ``fault_rankR`` exists (a transient failure, which a job
    restarted by ``torchrun --max_restarts`` meets no more).
    """

    def __init__(self, mode, at, rank=None, once=False):
        self.mode, self.at, self.rank, self.once = mode, at, rank, once

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 != self.at or self.rank not in (None, runner.rank):
            return
        if self.once and os.path.exists(os.path.join(runner.work_dir, f"fault_rank{runner.rank}")):
            return
        _mark(runner, "fault")
        if self.mode == "exit":
            os._exit(3)
        if self.mode == "raise":
            raise RuntimeError(f"injected fault in rank {runner.rank}")
        if self.mode == "sleep":  # until the test kills this rank
            time.sleep(900)
        if self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)


@HOOKS.register_module()
class SlowSaveHook(Hook):
    """Rank 0's save of the checkpoint of iteration ``at`` takes ``seconds`` more (a slow
    disk), before the file is written; ``saving_rank0`` marks its start."""

    def __init__(self, at, seconds):
        self.at, self.seconds = at, seconds

    def before_save_checkpoint(self, runner, checkpoint):
        if checkpoint["meta"]["iter"] == self.at:
            _mark(runner, "saving")
            time.sleep(self.seconds)


@HOOKS.register_module()
class SaveRecorderHook(Hook):
    """Records, per rank, each checkpoint save it enters and each file it writes."""

    def before_run(self, runner):
        import torch

        log = os.path.join(runner.work_dir, f"saves_rank{runner.rank}.txt")
        write = torch.save  # what GCURunner writes a checkpoint file with

        def recording_write(checkpoint, filename, *args, **kwargs):
            with open(log, "a") as f:
                f.write(f"write {os.path.basename(filename)}\n")
            return write(checkpoint, filename, *args, **kwargs)

        torch.save = recording_write  # a test's spy, in its own process
        self.log = log

    def before_save_checkpoint(self, runner, checkpoint):
        with open(self.log, "a") as f:
            f.write(f"save iter {checkpoint['meta']['iter']}\n")


@HOOKS.register_module()
class WaitForFileHook(Hook):
    """After train iteration ``at``, rank 0 waits until ``path`` exists (the test holds a
    running job there while it starts another)."""

    def __init__(self, at, path):
        self.at, self.path = at, path

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 == self.at and runner.rank == 0:
            _mark(runner, "holding")
            while not os.path.exists(self.path):
                time.sleep(0.2)
