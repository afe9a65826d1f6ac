"""Write a small segmentation dataset in mmseg's folder layout, for the demo and the tests.

    data_root/img_dir/{train,val}/NNN.png   RGB images
    data_root/ann_dir/{train,val}/NNN.png   label maps (class ids 0..C-1)

Each image is a few rectangles of class-specific colour plus noise on a dark background:
a task a small model learns in tens of iterations (``make demo``), so the validation mIoU
says whether training works. Rectangles span a fifth to five eighths of the image side, so
background is about two thirds of the pixels: predicting background everywhere scores an
mIoU of about 17 on four classes. The same seed writes the same files.
"""

import argparse
import os
import os.path as osp
from typing import Sequence, Tuple

import numpy as np
from PIL import Image

COLOURS = np.array([[20, 20, 20], [200, 40, 40], [40, 200, 40], [40, 40, 200]], np.uint8)


def make_sample(rng: np.random.Generator, size: int, classes: int, width: int = 0):
    """An image and its label map, ``size`` high and ``width`` (default ``size``) wide."""
    width = width or size
    label = np.zeros((size, width), np.uint8)
    for _ in range(3):
        c = int(rng.integers(1, classes))
        y, x = rng.integers(0, size - size // 5), rng.integers(0, width - width // 5)
        h, w = rng.integers(size // 5, size * 5 // 8), rng.integers(width // 5, width * 5 // 8)
        label[y : y + h, x : x + w] = c
    image = COLOURS[label % len(COLOURS)].astype(np.int16)
    image += rng.integers(-20, 21, image.shape, dtype=np.int16)
    return np.clip(image, 0, 255).astype(np.uint8), label


def write_dataset(
    root: str,
    train: int = 64,
    val: int = 16,
    size: int = 64,
    classes: int = 4,
    seed: int = 0,
    val_sizes: Sequence[Tuple[int, int]] = (),
) -> str:
    """Write the dataset under ``root`` (files already there are overwritten); validation
    images of ``val_sizes`` (height, width) in turn where given, else ``size`` square."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("val", val)):
        img_dir = osp.join(root, "img_dir", split)
        ann_dir = osp.join(root, "ann_dir", split)
        os.makedirs(img_dir, exist_ok=True)
        os.makedirs(ann_dir, exist_ok=True)
        for i in range(count):
            h, w = val_sizes[i % len(val_sizes)] if split == "val" and val_sizes else (size, size)
            image, label = make_sample(rng, h, classes, w)
            Image.fromarray(image).save(osp.join(img_dir, f"{i:03d}.png"))
            Image.fromarray(label).save(osp.join(ann_dir, f"{i:03d}.png"))
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="where to write the dataset (e.g. data/synthetic)")
    parser.add_argument("--train", type=int, default=64)
    parser.add_argument("--val", type=int, default=16)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument(
        "--val-sizes", default="", help="validation image sizes in turn, e.g. 48x64,80x56"
    )
    args = parser.parse_args()
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.val_sizes.split(",") if s]
    write_dataset(args.root, args.train, args.val, args.size, val_sizes=sizes)
    print(f"synthetic dataset written to {args.root}")


if __name__ == "__main__":
    main()
