"""Stock mmseg configs on a real XLA runtime and on the simulated T20 card, before and after
mmgcu keeps their graph whole.

    python -m tests.conformance.xla_zoo run BACKEND FAMILY on|off   # one JSON line
    python -m tests.conformance.xla_zoo table --out docs/xla_zoo.md [FAMILY ...]

``run`` trains a zoo family's stock config (``tools/zoo.py``'s) as a rehearsal derives it
(:func:`mmgcu.rehearsal.plan.derive`: ``--scale small``, synthetic data of the dataset's
shapes, no pretrained weights) with GCURunner in one process on one card, 4 iterations
and a validation of 8 images, with ``gcu_whole_graph`` on or off, and prints the graph runs
and compiles of each iteration and of the validation. Before validation the decode head is
set to predict class 0 everywhere, as ``programs.py``'s validations do: the data-dependent
shapes of the stock metric (how many pixels agree with the label) are then the labels'
alone, the same on both runtimes; the trained weights differ between them (dropout draws
other numbers on torch_xla), and a model 4 steps from random predicts near-uniform logits
that tip either way. On ``xla`` the card is torch_xla 2.9's
CPU device, driven through torch_gcu 1.x's API (``torch_gcu_on_xla.py``); on ``sim`` it is a
simulated T20 card with the lowering profile that ``MMGCU_SIM_XLA`` names.

``table`` runs every family both ways on three cards (torch_xla; the simulated card with
torch_xla 2.9's lowerings, ``xla-cpu``; the simulated card with the T20's, ``t20``), each
run a process of its own (a fresh compile cache, as a job has), and writes the markdown
table (``make xla-zoo``). It takes about an hour on 2 cores: torch_xla compiles each
graph on the CPU. Each cell's result is kept in ``zoo_results/xla_zoo.json`` (``--results``),
and a rerun runs only the cells missing or failed there: delete it for a table of one run.
"""

import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import tempfile
from typing import Dict, List

from .backends import backend, delta
from .programs import predict_one_class

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
ITERS = 4
VAL_IMAGES = 8
#: Five of the zoo's families: the issue's FCN-R50, PSANet and Segformer, and two with
#: auxiliary heads of another kind (DeepLabV3+ on ResNet-18, BiSeNetV1's context path).
FAMILIES = ("fcn", "psanet", "segformer", "deeplabv3plus", "bisenetv1")
#: Where each card runs: (python, backend, MMGCU_SIM_XLA or None).
CARDS = {
    "torch_xla 2.9 (CPU)": (".venv-xla/bin/python", "xla", None),
    "simulated, xla-cpu lowerings": (".venv-t20/bin/python", "sim", "xla-cpu"),
    "simulated, T20 lowerings (the rehearsal's)": (".venv-t20/bin/python", "sim", "t20"),
}


def stock_config(family: str) -> str:
    sys.path.insert(0, osp.join(REPO, "tools"))
    import mmseg
    from zoo import FAMILIES as ZOO

    return osp.join(osp.dirname(mmseg.__file__), ".mim", "configs", ZOO[family][0])


def _config(family: str, whole: bool, root: str):
    """The rehearsal's config of the family's stock config, for one process and one card."""
    from mmengine.config import Config

    from mmgcu.rehearsal import data, plan

    cfg = Config.fromfile(stock_config(family))
    derived, changes = plan.derive(cfg, osp.join(root, "data"), ITERS, "small")
    derived["custom_hooks"] = [
        h for h in derived["custom_hooks"] if h.get("type") != "RehearsalHook"
    ]  # it reads the simulator's own records; this module counts on both backends
    side = changes["image_side"]
    batch = int(derived["train_dataloader"].get("batch_size", 1))
    data_root = osp.join(root, "data")
    data.write_dataset(
        data_root, derived["train_dataloader"]["dataset"], "train", [(side, side)] * batch,
        derived["model"],
    )  # fmt: skip
    sizes, _ = data.val_sizes(cfg.val_dataloader.dataset, VAL_IMAGES, side, changes["factor"])
    data.write_dataset(
        data_root, derived["val_dataloader"]["dataset"], "val", sizes, derived["model"], seed=1
    )
    derived.update(launcher="none", work_dir=osp.join(root, "work"), gcu_whole_graph=whole)
    derived["default_hooks"]["checkpoint"]["interval"] = ITERS * 10  # no save: not counted
    return Config(derived), sizes


def rehearsed(be, family: str, whole: bool) -> Dict[str, object]:
    """Graph runs and compiles of each iteration and of the validation."""
    be.torch_gcu_api()
    from mmengine.hooks import Hook

    from mmgcu import GCURunner

    class Count(Hook):
        priority = "LOWEST"

        def __init__(self):
            self.steps: List[dict] = []
            self.val = None

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            self.mark = be.counts()

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            self.steps.append(delta(be.counts(), self.mark))

        def before_val_epoch(self, runner):
            from mmengine.model import is_model_wrapper

            model = runner.model.module if is_model_wrapper(runner.model) else runner.model
            predict_one_class(model)
            be.step()  # the head's new weights are device data before validation counts
            self.mark = self.image = be.counts()
            self.images: List[dict] = []

        def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            now = be.counts()
            self.images.append(delta(now, self.image))
            self.image = now

        def after_val_epoch(self, runner, metrics=None):
            self.val = delta(be.counts(), self.mark)

    # the synthetic data and the work dir (hundreds of MB) go with the run
    with tempfile.TemporaryDirectory(prefix=f"mmgcu-xla-zoo-{family}-") as root:
        cfg, sizes = _config(family, whole, root)
        runner = GCURunner.from_cfg(cfg)
        count = Count()
        runner.register_hook(count)
        runner.train()
    out = dict(steps=count.steps, val=count.val, val_images=len(sizes), val_sizes=len(set(sizes)))
    return dict(out, val_per_image=count.images)


def _run_one(card: str, family: str, whole: bool) -> dict:
    python, name, profile = CARDS[card]
    env = {**os.environ, "PYTHONPATH": REPO, "PJRT_DEVICE": "CPU"}
    if profile:
        env.update(MMGCU_SIM_XLA=profile, MMGCU_SIMULATE="t20:1")
    cmd = [osp.join(REPO, python), "-m", "tests.conformance.xla_zoo", "run", name, family]
    proc = subprocess.run(
        cmd + ["on" if whole else "off"], cwd=REPO, env=env, capture_output=True, text=True
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return dict(error=(proc.stderr or proc.stdout).strip().splitlines()[-1][:200])
    return json.loads(lines[-1])


def _cell(result: dict) -> str:
    if "error" in result:
        return f"error: {result['error']}"
    steps, val = result["steps"], result["val"]
    later = steps[2:]
    runs = "/".join(str(s["runs"]) for s in steps)
    compiles = sum(s["compiles"] for s in later)
    fallbacks = sorted({k for s in later for k in s["fallbacks"]})
    text = f"{runs}; {compiles}; {val['compiles']} / {val['runs']}"
    return text + (f" ({', '.join(fallbacks)})" if fallbacks else "")


def _kept(path: str) -> Dict[str, dict]:
    """The cells an earlier ``table`` run left in ``path``, by ``family|whole|card``."""
    if not osp.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _run_cells(families: List[str], path: str) -> Dict[str, dict]:
    """Each cell's result, run unless ``path`` keeps it from an earlier run without an error
    (an hour's table survives one failed cell); ``path`` is rewritten after each cell."""
    sys.path.insert(0, osp.join(REPO, "tools"))
    from zoo import run_stamp

    kept, stamp = _kept(path), run_stamp()
    for family, whole, card in ((f, w, c) for f in families for w in (False, True) for c in CARDS):
        key = f"{family}|{whole}|{card}"
        if "error" in kept.get(key, {"error": None}):
            kept[key] = dict(_run_one(card, family, whole), run=stamp)
            os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                json.dump(kept, f, indent=1)
        print(f"xla-zoo: {family} whole={whole} {card}: {_cell(kept[key])}", flush=True)
    return kept


def table(args) -> int:
    families = args.families or list(FAMILIES)
    kept = _run_cells(families, args.results)
    results = {
        (f, w, c): kept[f"{f}|{w}|{c}"] for f in families for w in (False, True) for c in CARDS
    }
    runs = sorted({r["run"] for r in results.values()})
    lines = [
        "# Stock configs on torch_xla and on the simulated T20 card",
        "",
        "Written by `make xla-zoo` (`tests/conformance/xla_zoo.py`): each family's stock",
        "mmseg 1.2.2 config (the zoo's) as a rehearsal derives it (`--scale small`, synthetic",
        "data of the dataset's shapes, no pretrained weights), trained by GCURunner in one",
        f"process on one card for {ITERS} iterations, then validated on {VAL_IMAGES} images; "
        "each run a process of its own.",
        "`gcu_whole_graph=False` is the stock model; `True` (the default on a T20) is the model",
        "mmgcu keeps whole (accuracy and loss divisor on the card, metric on the host,",
        "validation inputs padded to a few sizes).",
        "",
        "Each cell: graph runs of each iteration; graphs compiled after the 2 of warm-up;",
        "validation's compiles / graph runs; the ops that fell back to the CPU after warm-up.",
        "Runs started " + "; ".join(runs) + ".",
        "",
        "| family | gcu_whole_graph | " + " | ".join(CARDS) + " |",
        "|---|---|" + "---|" * len(CARDS),
    ]
    for family, whole in ((f, w) for f in families for w in (False, True)):
        cells = " | ".join(_cell(results[(family, whole, c)]) for c in CARDS)
        lines.append(f"| {family} | {whole} | {cells} |")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"xla-zoo: wrote {args.out}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run")
    p.add_argument("backend", choices=("xla", "sim"))
    p.add_argument("family")
    p.add_argument("whole", choices=("on", "off"))
    p = sub.add_parser("table")
    p.add_argument("families", nargs="*")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--results",
        default=osp.join(REPO, "zoo_results", "xla_zoo.json"),
        help="each cell's result; a rerun runs only the cells missing or failed there",
    )
    args = parser.parse_args(argv)
    if args.command == "table":
        return table(args)
    result = rehearsed(backend(args.backend), args.family, args.whole == "on")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
