"""Section 8, ``padding``: what validating at a few padded shapes changes in the metric.

On a T20 card mmgcu pads each validation batch on the host up to a shape bucket (32, 48,
64, 96, ... px a side: ``mmgcu/model/whole_graph.py``) and crops the prediction back, so
that a validation of many image sizes compiles a handful of graphs. The network then sees
zeros (the normalised padding value) beyond the right and bottom edges, which can change
the logits near them. This section trains ``make demo``'s config (8 simulated T20 cards,
40 iterations) and tests its checkpoint on validation images of 12 sizes (48 to 96 px a
side) with ``gcu_whole_graph`` off (each image at its own size, the stock model) and on
(padded to buckets), and reports both metrics and their difference. Information only: the
difference depends on the model and the data.
"""

import os.path as osp
import re

from harness import REPO, log

TITLE = "padding"
DEMO = osp.join(REPO, "configs", "tiny", "fcn_r18-tiny-d8_8xgcu-40it_synthetic-64x64.py")
#: 12 validation sizes (height, width), as a keep-ratio resize gives photos of 6 aspects.
SIZES = [(48, 64), (64, 48), (56, 80), (80, 56), (64, 96), (96, 64)]
SIZES += [(72, 72), (48, 88), (88, 48), (60, 76), (76, 60), (96, 96)]
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


def _dataset(h):
    root = osp.join(h.root, "data_padding")
    sizes = ",".join(f"{a}x{b}" for a, b in SIZES)
    cmd = [h.python, osp.join(REPO, "tools", "make_synthetic_dataset.py"), root]
    cmd += ["--train", "64", "--val", str(4 * len(SIZES)), "--val-sizes", sizes]
    code, _, _, path = h.run(cmd, h.env(), "dataset-padding")
    h.check(code, path, "tools/make_synthetic_dataset.py")
    return root


def run(h):
    cfg = h.config("padding", _dataset(h), ["train_cfg = dict(val_interval=1000)"], base=DEMO)
    env = h.env(simulate="t20", api="gcu1", PYTHON=h.python)
    work = h.work_dir("padding")
    log("padding: train make demo's config on 8 simulated T20 cards")
    code, _, _, path = h.run(["bash", "tools/dist_train.sh", cfg, "--work-dir", work], env, "pad")
    h.check(code, path, "tools/dist_train.sh")
    out = dict(sizes=SIZES, images=4 * len(SIZES))
    for whole in (False, True):
        log(f"padding: test the checkpoint, gcu_whole_graph={whole}")
        cmd = ["bash", "tools/dist_test.sh", cfg, osp.join(work, "iter_40.pth")]
        cmd += ["--work-dir", f"{work}-test-{whole}", "--cfg-options", f"gcu_whole_graph={whole}"]
        code, _, _, path = h.run(cmd, env, f"padding-test-{whole}")
        h.check(code, path, "tools/dist_test.sh")
        with open(path) as f:
            out["padded" if whole else "own_size"] = metrics_of(f.read())
    out["difference"] = {m: round(out["padded"][m] - out["own_size"][m], 2) for m in METRICS}
    out["passed"] = True  # information only
    return out


def rows(result):
    own, padded, diff = result["own_size"], result["padded"], result["difference"]
    what = f"make demo's model, {result['images']} validation images of 12 sizes"
    return [
        (f"{what}: {m}, each at its own size / padded to buckets (difference)",
         f"{own[m]:.2f} / {padded[m]:.2f} ({diff[m]:+.2f})", "%", "info", "")
        for m in METRICS
    ]  # fmt: skip
