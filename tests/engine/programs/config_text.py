"""A GCURunner on simulated cards, started as one rank of a job (RANK, WORLD_SIZE, MASTER_*
set): how many times this rank formatted the config while the runner was built, and the
text's digest. ``CONFIG_NOTE_RANK=N``: rank N's config has a key of its own;
``CONFIG_UNFORMATTABLE=1``: a config mmengine cannot format, and how each rank stopped.
Prints one JSON line."""

import hashlib
import json
import os
import time

import mmengine.config.config as mm_config
from mmengine.testing import RunnerTestCase

import mmgcu  # noqa: F401  (installs the simulator)
from mmgcu.engine.runner import GCURunner
from mmgcu.runtime.dist import lost_peer

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
if os.environ.get("CONFIG_UNFORMATTABLE"):
    cfg.note = object()  # its repr is no Python: yapf refuses the text
    cfg.randomness = dict(seed=0)  # no collective (a seed sync) before the config is logged
try:
    runner = GCURunner.from_cfg(cfg)
except (SyntaxError, RuntimeError) as exc:
    error = "rank 0 is gone" if lost_peer(exc) else str(exc).splitlines()[0]
    print(json.dumps(dict(rank=int(os.environ["RANK"]), error=error)), flush=True)
    if os.environ["RANK"] == "0":
        time.sleep(20)  # rank 0 alive but stopped, as under a launcher that kills no rank
    raise SystemExit(0) from None
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
