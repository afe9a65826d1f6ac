"""Synthetic images and masks in the layout the config's own dataset class reads.

A T20 host often has neither the user's dataset nor a network. The rehearsal writes a small
set that the config's dataset class (``LoveDADataset``, ``ADE20KDataset``, ...) and its
train and val pipelines read unchanged: ``img_dir/{train,val}`` and ``ann_dir/{train,val}``
with the class's own file suffixes, a split file listing them, masks whose labels are those
the class and the model know (shifted by one where the dataset reduces label 0, with a
border of the ignore index). Images are regions of one class each, coloured by their class
plus noise, so a few steps already lower the loss. Seeded: both legs read the same files.
"""

import inspect
import os
import os.path as osp
from typing import Dict

import numpy as np

from .plan import inner_dataset

IGNORE_INDEX = 255


def dataset_facts(dataset_cfg: dict) -> Dict[str, object]:
    """The suffixes, label reduction and class count the config's dataset class uses."""
    from mmseg.registry import DATASETS
    from mmseg.utils import register_all_modules

    register_all_modules(init_default_scope=False)
    inner = inner_dataset(dataset_cfg)
    cls = DATASETS.get(inner["type"])
    if cls is None:
        raise KeyError(f"dataset type {inner['type']!r} is not in mmseg's registry")
    defaults = {
        name: p.default
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }

    def get(key, fallback):
        return inner.get(key, defaults.get(key, fallback))

    classes = (inner.get("metainfo") or {}).get("classes") or cls.METAINFO.get("classes", ())
    return dict(
        type=inner["type"],
        img_suffix=get("img_suffix", ".jpg"),
        seg_map_suffix=get("seg_map_suffix", ".png"),
        reduce_zero_label=bool(get("reduce_zero_label", False)),
        classes=len(classes),
    )


def write_split(
    root: str,
    split: str,
    count: int,
    side: int,
    classes: int,
    facts: dict,
    ignore_index: int = IGNORE_INDEX,
    seed: int = 0,
) -> None:
    """``count`` image/mask pairs of ``side`` x ``side`` for ``split``, and its list."""
    import cv2

    rng = np.random.RandomState(seed)
    img_dir, ann_dir = osp.join(root, "img_dir", split), osp.join(root, "ann_dir", split)
    os.makedirs(img_dir, exist_ok=True)
    os.makedirs(ann_dir, exist_ok=True)
    palette = rng.randint(0, 256, size=(max(classes, 1), 3))
    names = []
    for i in range(count):
        cells = 4
        grid = rng.randint(0, classes, size=(cells, cells))
        labels = np.kron(grid, np.ones((side // cells + 1,) * 2, dtype=np.int64))[:side, :side]
        image = palette[labels] + rng.randint(-20, 21, size=(side, side, 3))
        mask = labels + 1 if facts["reduce_zero_label"] else labels.copy()
        # a border the loss ignores: label 0 where the dataset reduces it to the ignore index
        mask[:2, :] = 0 if facts["reduce_zero_label"] else ignore_index
        name = f"{split}_{i:03d}"
        image = image.clip(0, 255).astype(np.uint8)
        cv2.imwrite(osp.join(img_dir, name + facts["img_suffix"]), image)
        cv2.imwrite(osp.join(ann_dir, name + facts["seg_map_suffix"]), mask.astype(np.uint8))
        names.append(name)
    with open(osp.join(root, f"{split}.txt"), "w") as f:
        f.write("\n".join(names) + "\n")


def write_dataset(
    root: str,
    dataset_cfg: dict,
    split: str,
    count: int,
    side: int,
    model: dict,
    seed: int = 0,
) -> dict:
    """Write ``split`` of the synthetic set under ``root`` for the dataset ``dataset_cfg``
    reads (its class's suffixes and label reduction), with the labels the model predicts
    and its ignore index; return what was written."""
    facts = dataset_facts(dataset_cfg)
    head = head_of(model)
    known = [c for c in (head.get("num_classes"), facts["classes"]) if c]
    classes = min(known) if known else 2
    ignore_index = int(head.get("ignore_index", IGNORE_INDEX))
    write_split(root, split, count, side, classes, facts, ignore_index, seed)
    return dict(facts, labels=classes, ignore_index=ignore_index, image_side=side, count=count)


def head_of(model: dict) -> dict:
    """The model's decode head (the last of a cascade: it predicts), or ``{}``."""
    head = model.get("decode_head")
    if isinstance(head, (list, tuple)):
        head = head[-1]
    return head or {}
