"""Stands in for train.py under the rehearsal's torchrun: each rank writes the arguments it
is given and the environment it runs in to ``<--work-dir>/env-rank<RANK>.json``."""

import json
import os
import sys

work_dir = sys.argv[sys.argv.index("--work-dir") + 1]
with open(os.path.join(work_dir, f"env-rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(dict(argv=sys.argv[1:], env=dict(os.environ)), f)
