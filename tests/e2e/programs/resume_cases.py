"""``--resume`` (``resume=True``) against work dirs in the states a crash or an operator
leaves; prints, as JSON, per case the iteration training resumed at and the ``mmgcu:``
message of a refusal.

Usage: resume_cases.py ROOT
"""

import glob
import json
import os
import os.path as osp
import shutil
import sys

from mmengine.hooks import Hook
from tiny_runner import runner

from mmgcu import GCUError

ROOT = sys.argv[1]


class StartAt(Hook):
    def before_train(self, runner):
        self.iter = runner.iter


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def empty(path):
    open(path, "w").close()


def prepare(name, damage):
    """A copy of a run killed after iteration 4 (iter_2.pth, iter_4.pth), then damaged."""
    work = osp.join(ROOT, name)
    shutil.copytree(osp.join(ROOT, "base"), work)
    write(osp.join(work, "last_checkpoint"), osp.join(work, "iter_4.pth"))
    damage(work)
    return work


def no_last(work):
    os.remove(osp.join(work, "last_checkpoint"))


def all_damaged(work):
    for path in glob.glob(osp.join(work, "iter_*.pth")):
        empty(path)
    no_last(work)


def nothing(work):
    for path in glob.glob(osp.join(work, "*")):
        shutil.rmtree(path) if osp.isdir(path) else os.remove(path)


CASES = {
    "last_checkpoint missing": no_last,
    "last_checkpoint empty": lambda w: write(osp.join(w, "last_checkpoint"), ""),
    "last_checkpoint names a deleted file": lambda w: write(
        osp.join(w, "last_checkpoint"), osp.join(w, "iter_6.pth")
    ),
    "newest checkpoint empty": lambda w: empty(osp.join(w, "iter_4.pth")),
    "every checkpoint damaged": all_damaged,
    "no checkpoint": nothing,
}

runner(osp.join(ROOT, "base"), "base", max_iters=4).train()
results = {}
for name, damage in CASES.items():
    work = prepare(name.replace(" ", "_"), damage)
    start = StartAt()
    job = runner(work, name.replace(" ", "_"), max_iters=6, resume=True, custom_hooks=[start])
    try:
        job.train()
        results[name] = dict(start=start.iter, end=job.iter)
    except GCUError as e:
        results[name] = dict(error=str(e))
# A card-count (here: batch) change on resume: the global batch halves.
work = prepare("smaller_batch", lambda w: None)
job = runner(work, "smaller_batch", max_iters=6, batch=1, resume=True)
job.train()
results["smaller batch"] = dict(end=job.iter)
print(json.dumps(results))
