"""Checkpoint hooks: checkpoints that load on every stack and that a crash cannot all lose.

``CPUCheckpointHook`` makes a checkpoint plain (:func:`mmgcu.checkpoint.plain.plain`):
CPU tensors and plain Python values only. mmengine 0.10.7 moves the model's weights, the
optimizer state and the message hub to the CPU, but not what ``before_save_checkpoint``
hooks add (an EMA model, say). A card tensor left in a checkpoint opens only where that
card's torch_gcu is installed: torch 1.10 pickles an ``xla`` tensor through numpy with its
device name, and ``map_location`` does not apply to it. The message hub's
``HistoryBuffer`` objects and numpy values would tie the file to numpy's major version and
make torch >= 2.6 refuse it; the hook restores the hub's objects when a checkpoint is
loaded. ``GCURunner`` registers this hook last, so it sees what the others add.

``GCUCheckpointHook`` stands in for mmengine's ``CheckpointHook``. With
``max_keep_ckpts=1``, the stock hook deletes the previous checkpoint before it writes the
new one and then rewrites ``last_checkpoint`` in place: a job killed during a save is left
with no checkpoint and a ``last_checkpoint`` naming a deleted file.
"""

import logging
import os.path as osp

from mmengine.dist import is_main_process
from mmengine.hooks import CheckpointHook, Hook
from mmengine.registry import HOOKS

from ..compat.mmengine import StepSaveCheckpointHook
from ..counterparts import replaces
from ..runtime.files import write_text_atomically
from .files import LAST, batch_change_message, remove_partials
from .io import local_folder
from .plain import plain, restore_message_hub

#: What the message hub (saved in every checkpoint) records about the global batch.
BATCH_KEY = "mmgcu_global_batch"


@HOOKS.register_module()
class CPUCheckpointHook(Hook):
    """Makes a checkpoint plain (CPU tensors, plain values) before it is written, and
    restores the message hub's objects after one is loaded."""

    priority = "LOWEST"

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        for key, value in checkpoint.items():
            checkpoint[key] = plain(value)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        restore_message_hub(checkpoint)


@HOOKS.register_module()
@replaces(
    CheckpointHook,
    why="it deletes the previous checkpoint before the new one is written and rewrites "
    "last_checkpoint in place, so a crash during a save can lose every checkpoint",
    does="it writes each checkpoint under a temporary name and renames it, then removes the "
    "old ones, so a crash during a save loses none",
    everywhere=True,
)
class GCUCheckpointHook(StepSaveCheckpointHook):
    """:class:`CheckpointHook` (same options) whose saves cannot lose the last checkpoint.

    Order of a save: the new file (written atomically by ``GCURunner.save_checkpoint``),
    then ``last_checkpoint`` (replaced atomically), then the checkpoints beyond
    ``max_keep_ckpts``. At the start of training, partial files of killed saves are
    removed, and a resume on another number of ranks logs how the global batch changed.
    """

    def before_train(self, runner) -> None:
        super().before_train(runner)
        if is_main_process() and self._local():
            removed = remove_partials(self.out_dir)
            if removed:
                runner.logger.warning(
                    f"mmgcu: removed {len(removed)} partial checkpoint file(s) that a killed "
                    f"save left in {self.out_dir}: {', '.join(removed)}"
                )
        _note_global_batch(runner)

    def _local(self) -> bool:
        return local_folder(self.out_dir, self.backend_args)

    def save_step(self, runner, step, meta):
        if not self._local():  # a remote backend: its own write semantics
            return super().save_step(runner, step, meta)
        outdated = self._rotate(runner, step)
        filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, filename)
        runner.message_hub.update_info("last_ckpt", self.last_ckpt)
        runner.save_checkpoint(
            self.out_dir,
            filename,
            self.file_client_args,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler,
            meta=meta,
            by_epoch=self.by_epoch,
            backend_args=self.backend_args,
            **self.args,
        )
        if not is_main_process():
            return
        write_text_atomically(osp.join(runner.work_dir, LAST), self.last_ckpt)
        for old in outdated:  # only now that the new one is complete and recorded
            path = self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(old))
            if self.file_backend.isfile(path):
                self.file_backend.remove(path)
            elif self.file_backend.isdir(path):  # deepspeed saves folders
                self.file_backend.rmtree(path)

    def _rotate(self, runner, step) -> list:
        """Record ``step`` among the kept checkpoints; return the steps to delete after it."""
        if self.max_keep_ckpts <= 0 or (self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step):
            return []
        outdated = []
        if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
            outdated.append(self.keep_ckpt_ids.popleft())
        self.keep_ckpt_ids.append(step)
        runner.message_hub.update_info("keep_ckpt_ids", list(self.keep_ckpt_ids))
        return outdated


def _note_global_batch(runner) -> None:
    """Warn when a resumed checkpoint was trained with another global batch; record ours.

    The record lives in the message hub, which a checkpoint saves and only a resume
    restores (``load_from`` does not), so only a resume compares.
    """
    loader = runner.train_dataloader
    per_rank = getattr(loader, "batch_size", None)
    if not isinstance(per_rank, int):
        return
    now = dict(ranks=runner.world_size, per_rank=per_rank)
    then = runner.message_hub.get_info(BATCH_KEY)
    if isinstance(then, dict) and then.get("ranks"):
        lr = runner.optim_wrapper.get_lr().get("lr") if hasattr(runner, "optim_wrapper") else None
        message = batch_change_message(then, now, lr)
        if message:
            runner.logger.log(logging.WARNING, f"mmgcu: {message}")
    runner.message_hub.update_info(BATCH_KEY, now)
