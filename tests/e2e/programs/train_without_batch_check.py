"""tools/train.py with mmgcu's first-batch check removed (it has no config switch).

Usage: train_without_batch_check.py TRAIN_PY [train.py arguments]
"""

import runpy
import sys

import mmgcu.engine.strategy

mmgcu.engine.strategy.watch_first_batch = lambda model, device: None
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
