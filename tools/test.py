"""Test (and evaluate) an mmseg model on GCU cards: mmgcu's test entry, as a script.

mmseg 1.2.2's own tools/test.py ignores ``runner_type``; this runs
:mod:`mmgcu.cli.test_entry` (same arguments), which honours it. ``mmgcu test`` and
``tools/dist_test.sh`` run it on every card under torchrun.

    python tools/test.py CONFIG CHECKPOINT [--work-dir W] [--out DIR] [--show-dir DIR]
        [--tta] [--cfg-options k=v ...] [--launcher none|pytorch|slurm|mpi]
"""

import os.path as osp
import sys

if __name__ == "__main__":
    # This checkout's mmgcu, as tools/dist_test.sh gives its workers.
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
    from mmgcu.cli.test_entry import main

    main()
