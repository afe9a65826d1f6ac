"""tools/train.py without its argparse (which sets LOCAL_RANK=0 when it is missing and
limits --launcher to its choices): the config's runner, built as train.py builds it.

Usage: build_runner.py CONFIG WORK_DIR LAUNCHER
"""

import sys

from mmengine.config import Config
from mmseg.registry import RUNNERS

cfg = Config.fromfile(sys.argv[1])
cfg.work_dir = sys.argv[2]
cfg.launcher = sys.argv[3]
RUNNERS.build(cfg).train()
