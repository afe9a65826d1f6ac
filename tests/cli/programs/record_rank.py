"""Stands in for a training/test script under torchrun: each rank writes its argv and the
environment a worker of `mmgcu train` gets to $RECORD_DIR/rank<RANK>.json."""

import json
import os
import sys

NAMES = ("LOCAL_RANK", "WORLD_SIZE", "PYTHONPATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
with open(os.path.join(os.environ["RECORD_DIR"], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(dict(argv=sys.argv[1:], env={k: os.environ.get(k) for k in NAMES}), f)
sys.exit(int(os.environ.get("RECORD_EXIT", "0")))
