"""A GCURunner on simulated cards, started as one rank of a job (RANK, WORLD_SIZE, MASTER_*
set): how many times this rank formatted the config while the runner was built, and the
text's digest. ``CONFIG_NOTE_RANK=N``: rank N's config has a key of its own. Prints one
JSON line."""

import hashlib
import json
import os

import mmengine.config.config as mm_config
from mmengine.testing import RunnerTestCase

import mmgcu  # noqa: F401  (installs the simulator)
from mmgcu.engine.runner import GCURunner

calls = []
real = mm_config.FormatCode
mm_config.FormatCode = lambda *a, **k: calls.append(1) or real(*a, **k)

case = RunnerTestCase()
case.setUp()
cfg = case.epoch_based_cfg
cfg.launcher = "pytorch"
cfg.work_dir = os.environ["WORK_DIR"]
cfg.experiment_name = "config_text"
if os.environ.get("CONFIG_NOTE_RANK") == os.environ["RANK"]:
    cfg.note = "this rank's own"
runner = GCURunner.from_cfg(cfg)
text = runner.cfg.pretty_text
print(
    json.dumps(
        dict(
            rank=runner.rank,
            formatted=len(calls),
            digest=hashlib.sha256(text.encode()).hexdigest(),
            plain=text == mm_config.Config(runner.cfg.to_dict()).pretty_text,
        )
    )
)
