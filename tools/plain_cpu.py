"""A rehearsal's config trained on the plain CPU: one process, no simulator, no mmgcu.

    python tools/plain_cpu.py CONFIG WORK_DIR ITERS

CONFIG is a rehearsal's own (``rehearsal/<name>_rehearsal.py`` in its work dir: the
synthetic data it names are there). mmgcu's keys and hooks are taken out, so a stock
mmengine Runner trains the model (SyncBN reverted to BN, as for any job without a
launcher) for ITERS iterations, with no validation and no checkpoint. Prints one JSON line,
``{"losses": [...]}``, each iteration's total loss. ``make zoo`` runs it with both legs'
python where their losses differ: what the two torch builds give without mmgcu.
"""

import json
import sys

from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import Runner


@HOOKS.register_module()
class PlainLosses(Hook):
    """Each iteration's total loss, as the log reads it."""

    def __init__(self):
        self.losses = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.losses.append(float(outputs["loss"]))


def plain(cfg: Config, work_dir: str, iters: int) -> Config:
    """``cfg`` without mmgcu: stock runner, no launcher, no validation, no save."""
    cfg.custom_imports = dict(imports=["mmseg.models", "mmseg.datasets"])
    cfg.pop("runner_type", None)
    cfg.custom_hooks = []
    cfg.update(launcher="none", load_from=None, resume=False, work_dir=work_dir)
    cfg.train_cfg = dict(type="IterBasedTrainLoop", max_iters=iters, val_interval=iters + 1)
    for stage in ("val", "test"):
        for key in ("cfg", "dataloader", "evaluator"):
            cfg[f"{stage}_{key}"] = None
    cfg.default_hooks.checkpoint = None
    return cfg


def main(argv) -> int:
    config, work_dir, iters = argv[0], argv[1], int(argv[2])
    runner = Runner.from_cfg(plain(Config.fromfile(config), work_dir, iters))
    probe = PlainLosses()
    runner.register_hook(probe)
    runner.train()
    print(json.dumps(dict(losses=probe.losses)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
