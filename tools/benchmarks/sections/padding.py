"""Section 8, ``padding``: what validating at a few padded shapes changes in the metric.

On a T20 card mmgcu pads each validation batch on the host up to a shape bucket (32, 48,
64, 96, ... px a side: ``mmgcu/model/whole_graph.py``) and crops the prediction back, so
that a validation of many image sizes compiles a handful of graphs. The network then sees
zeros (the normalised padding value) beyond the right and bottom edges, which can change
the logits near them. This section trains ``make demo``'s config (8 simulated T20 cards,
40 iterations) and tests its checkpoint on validation images of 12 sizes (48 to 96 px a
side) with ``gcu_whole_graph`` off (each image at its own size, the stock model) and on
(padded to buckets), and reports both metrics and their difference; then the same on
images whose sizes are buckets already (the control: there the two must agree).
Information only: the difference depends on the model and the data.
"""

import os.path as osp
import re

from harness import REPO, log

TITLE = "padding"
DEMO = osp.join(REPO, "configs", "tiny", "fcn_r18-tiny-d8_8xgcu-40it_synthetic-64x64.py")
#: 12 validation sizes (height, width), as a keep-ratio resize gives photos of 6 aspects.
SIZES = [(48, 64), (64, 48), (56, 80), (80, 56), (64, 96), (96, 64)]
SIZES += [(72, 72), (48, 88), (88, 48), (60, 76), (76, 60), (96, 96)]
#: The control: sizes that are buckets already, where padding changes nothing.
BUCKETS = [(48, 64), (64, 96), (96, 96), (64, 48), (96, 64), (32, 48)]
METRICS = ("aAcc", "mIoU", "mAcc")


def needs_simulator(args):
    return True


def metrics_of(text: str) -> dict:
    """The last test metrics mmengine logged (``Iter(test) [n/n]  aAcc: ...``)."""
    found = {}
    for line in text.splitlines():
        if "Iter(test)" in line and "mIoU" in line:
            found = {m: float(re.search(rf"\b{m}: ([0-9.]+)", line).group(1)) for m in METRICS}
    if not found:
        raise RuntimeError("no test metrics in the log")
    return found


def _dataset(h, name, sizes):
    root = osp.join(h.root, f"data_{name}")
    cmd = [h.python, osp.join(REPO, "tools", "make_synthetic_dataset.py"), root]
    cmd += ["--train", "64", "--val", str(4 * len(sizes))]
    cmd += ["--val-sizes", ",".join(f"{a}x{b}" for a, b in sizes)]
    code, _, _, path = h.run(cmd, h.env(), f"dataset-{name}")
    h.check(code, path, "tools/make_synthetic_dataset.py")
    return root


def _test(h, env, cfg, checkpoint, whole, name):
    """The test metrics of ``checkpoint`` with ``gcu_whole_graph=whole``."""
    log(f"padding: test the checkpoint on {name}, gcu_whole_graph={whole}")
    cmd = ["bash", "tools/dist_test.sh", cfg, checkpoint, "--work-dir"]
    cmd += [h.work_dir(f"padding-{name}-{whole}"), "--cfg-options", f"gcu_whole_graph={whole}"]
    code, _, _, path = h.run(cmd, env, f"padding-{name}-{whole}")
    h.check(code, path, "tools/dist_test.sh")
    with open(path) as f:
        return metrics_of(f.read())


def _compare(h, env, cfg, checkpoint, name) -> dict:
    own = _test(h, env, cfg, checkpoint, False, name)
    padded = _test(h, env, cfg, checkpoint, True, name)
    return dict(
        own_size=own,
        padded=padded,
        difference={m: round(padded[m] - own[m], 2) for m in METRICS},
    )


def run(h):
    lines = ["train_cfg = dict(val_interval=1000)"]
    cfg = h.config("padding", _dataset(h, "sizes", SIZES), lines, base=DEMO)
    control = h.config("padding-buckets", _dataset(h, "buckets", BUCKETS), lines, base=DEMO)
    # card locks of its own: the metric does not depend on other jobs of the node
    locks = osp.join(h.root, "locks")
    env = h.env(simulate="t20", api="gcu1", PYTHON=h.python, MMGCU_LOCK_DIR=locks)
    work = h.work_dir("padding")
    log("padding: train make demo's config on 8 simulated T20 cards")
    code, _, _, path = h.run(["bash", "tools/dist_train.sh", cfg, "--work-dir", work], env, "pad")
    h.check(code, path, "tools/dist_train.sh")
    checkpoint = osp.join(work, "iter_40.pth")
    out = dict(sizes=SIZES, images=4 * len(SIZES), buckets=BUCKETS)
    out.update(_compare(h, env, cfg, checkpoint, "sizes"))
    out["control"] = _compare(h, env, control, checkpoint, "buckets")
    out["passed"] = True  # information only
    return out


def rows(result):
    own, padded, diff = result["own_size"], result["padded"], result["difference"]
    what = f"make demo's model, {result['images']} validation images of 12 sizes"
    return [
        (f"{what}: {m}, each at its own size / padded to buckets (difference)",
         f"{own[m]:.2f} / {padded[m]:.2f} ({diff[m]:+.2f})", "%", "info", "")
        for m in METRICS
    ] + [
        (f"the same on {len(BUCKETS) * 4} images of sizes that are buckets (control): "
         "difference in aAcc, mIoU, mAcc", " / ".join(
             f"{result['control']['difference'][m]:+.2f}" for m in METRICS), "%", "info", "")
    ]  # fmt: skip
