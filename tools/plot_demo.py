"""Pictures of a training run: loss and mIoU curves, and a few predictions, as PNG files.

    python tools/plot_demo.py WORK_DIR [--config CONFIG] [--images N]

Reads the scalars mmengine logged (``WORK_DIR/<timestamp>/vis_data/scalars.json``), and
runs the last checkpoint on the CPU over the first validation images (mmseg's
``init_model``/``inference_model``; a checkpoint saved on the cards opens anywhere). Writes
``WORK_DIR/curves.png`` and ``WORK_DIR/predictions.png``, then prints what was learnt next
to what a model that predicts background everywhere scores. ``make demo`` ends with it.
"""

import argparse
import glob
import json
import os.path as osp
import sys
import warnings
from typing import Dict, List, Tuple

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
# This checkout's mmgcu (the config imports it), as tools/dist_train.sh gives its workers.
sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402


def read_scalars(work_dir: str) -> Tuple[List[dict], List[dict]]:
    """The training and validation records of the newest run in ``work_dir``."""
    runs = sorted(glob.glob(osp.join(work_dir, "*", "vis_data", "scalars.json")))
    if not runs:
        sys.exit(f"plot_demo: no */vis_data/scalars.json under {work_dir}: did training run?")
    train, val = [], []
    with open(runs[-1]) as f:
        for line in f:
            record = json.loads(line)
            (val if "mIoU" in record else train).append(record)
    return train, val


def background_miou(ann_paths: List[str], num_classes: int) -> float:
    """The mIoU (in %) of predicting class 0 everywhere, as mmseg's IoUMetric computes it."""
    counts = np.zeros(num_classes, np.int64)
    for path in ann_paths:
        counts += np.bincount(np.asarray(Image.open(path)).ravel(), minlength=256)[:num_classes]
    ious = [counts[0] / counts.sum()] + [0.0 for c in counts[1:] if c > 0]
    return 100.0 * float(np.mean(ious))


def plot_curves(train: List[dict], val: List[dict], baseline: float, out: str) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot([r["step"] for r in train], [r["loss"] for r in train], marker=".")
    left.set(xlabel="iteration", ylabel="training loss", title="loss")
    steps = [0] + [r["step"] for r in val]
    right.plot(steps, [baseline] + [r["mIoU"] for r in val], marker="o", label="model")
    right.axhline(baseline, color="grey", linestyle="--", label="background everywhere")
    right.set(xlabel="iteration", ylabel="mIoU (%)", title="validation mIoU", ylim=(0, 100))
    right.legend(loc="lower right")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def load_model(config: str, checkpoint: str):
    """The trained segmentor on the CPU, with its config's test pipeline."""
    from mmengine.model import revert_sync_batchnorm
    from mmseg.apis import init_model

    from mmgcu.checkpoint.plain import mmengine_checkpoint_globals

    with mmengine_checkpoint_globals(checkpoint), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mmseg's own deprecations, said during training
        model = init_model(config, checkpoint, device="cpu")
    return revert_sync_batchnorm(model)


def predict(model, image_paths: List[str]) -> List[np.ndarray]:
    from mmseg.apis import inference_model

    return [inference_model(model, p).pred_sem_seg.data[0].numpy() for p in image_paths]


def paint(labels: np.ndarray, palette: np.ndarray) -> np.ndarray:
    return palette[np.clip(labels, 0, len(palette) - 1)]


def plot_predictions(images, truths, preds, palette, out: str) -> None:
    rows = len(images)
    fig, axes = plt.subplots(rows, 3, figsize=(6, 2 * rows), squeeze=False)
    for i, (image, truth, pred) in enumerate(zip(images, truths, preds)):
        for ax, shown, title in zip(
            axes[i],
            (image, paint(truth, palette), paint(pred, palette)),
            ("image", "ground truth", "prediction"),
        ):
            ax.imshow(shown, interpolation="nearest")
            ax.set_axis_off()
            if i == 0:
                ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def val_files(cfg) -> Tuple[List[str], List[str]]:
    """The validation images and label maps the config names, in file order."""
    ds = cfg.val_dataloader.dataset
    img_dir = osp.join(ds.data_root, ds.data_prefix.img_path)
    ann_dir = osp.join(ds.data_root, ds.data_prefix.seg_map_path)
    images = sorted(glob.glob(osp.join(img_dir, "*" + ds.get("img_suffix", ".jpg"))))
    anns = [
        osp.join(ann_dir, osp.splitext(osp.basename(p))[0] + ds.get("seg_map_suffix", ".png"))
        for p in images
    ]
    return images, anns


def checkpoint_of(work_dir: str) -> str:
    with open(osp.join(work_dir, "last_checkpoint")) as f:
        return f.read().strip()


def summary(train, val, baseline, files: Dict[str, str]) -> str:
    best = max(val, key=lambda r: r["mIoU"]) if val else None
    lines = [
        f"trained {train[-1]['step']} iterations: loss {train[0]['loss']:.2f} -> "
        f"{train[-1]['loss']:.2f}",
        f"validation mIoU {val[-1]['mIoU']:.1f} (best {best['mIoU']:.1f} at iteration "
        f"{best['step']}); a model that predicts background everywhere scores {baseline:.1f}",
    ]
    lines += [f"{name + ':':<13}{path}" for name, path in files.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dir", help="the --work-dir of the training run")
    parser.add_argument("--config", help="config of the run (default: the one in WORK_DIR)")
    parser.add_argument("--images", type=int, default=4, help="predictions to show")
    args = parser.parse_args(argv)

    from mmengine.config import Config

    config = args.config or sorted(glob.glob(osp.join(args.work_dir, "*.py")))[-1]
    cfg = Config.fromfile(config)
    train, val = read_scalars(args.work_dir)
    images, anns = val_files(cfg)
    baseline = background_miou(anns, cfg.model.decode_head.num_classes)
    files = {
        "curves": osp.join(args.work_dir, "curves.png"),
        "predictions": osp.join(args.work_dir, "predictions.png"),
        "checkpoint": osp.relpath(checkpoint_of(args.work_dir)),
    }
    plot_curves(train, val, baseline, files["curves"])
    model = load_model(config, files["checkpoint"])
    shown = images[: args.images]
    preds = predict(model, shown)
    palette = np.array(model.dataset_meta["palette"], np.uint8)
    pictures = [np.asarray(Image.open(p).convert("RGB")) for p in shown]
    truths = [np.asarray(Image.open(p)) for p in anns[: len(shown)]]
    plot_predictions(pictures, truths, preds, palette, files["predictions"])
    print(summary(train, val, baseline, files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
