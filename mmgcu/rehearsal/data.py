"""Synthetic images and masks in the layout the config's own dataset class reads.

A T20 host often has neither the user's dataset nor a network. The rehearsal writes a small
set that the config's dataset class (``LoveDADataset``, ``ADE20KDataset``, ...) and its
train and val pipelines read unchanged: ``img_dir/{train,val}`` and ``ann_dir/{train,val}``
with the class's own file suffixes, a split file listing them, masks whose labels are those
the class and the model know (shifted by one where the dataset reduces label 0, with a
border of the ignore index as deep as each image's own, so the count of ignored pixels
changes from image to image as real masks' does). Images are regions of one class each,
coloured by their class plus noise, so a few steps already lower the loss. Seeded: both
legs read the same files.

Validation images have the shapes of the dataset's (:func:`val_sizes`): on a lazy card each
new input shape compiles a graph, so a rehearsal on squares of one size would see one shape
where ADE20K has hundreds. They are the sizes of the user's own images where the config's
validation folder exists on this host (read from the files' headers), else the dataset's
as :data:`DATASET_SIZES` records them, scaled with the rehearsal's crops.
"""

import inspect
import os
import os.path as osp
from typing import Dict, List, Optional, Tuple

import numpy as np

from .plan import REAL_VAL_IMAGES, inner_dataset

IGNORE_INDEX = 255
#: Validation images per card at the small scale: enough shapes to see what each new one
#: costs a lazy card (at real scale: :data:`~.plan.REAL_VAL_IMAGES`).
VAL_IMAGES_PER_CARD = 8


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


#: Image sizes ``(h, w)`` of mmseg's datasets where all have one size, and None where sizes
#: and aspect ratios vary from image to image (natural photos: ADE20K, VOC, COCO-Stuff,
#: Pascal Context, ...). A dataset not listed is taken as varied.
DATASET_SIZES: Dict[str, Optional[Tuple[int, int]]] = {
    "CityscapesDataset": (1024, 2048),
    "LoveDADataset": (1024, 1024),
    "PotsdamDataset": (512, 512),
    "ISPRSDataset": (512, 512),
    "iSAIDDataset": (896, 896),
    "BDD100KDataset": (720, 1280),
    "DarkZurichDataset": (1080, 1920),
    "NightDrivingDataset": (1080, 1920),
    "DRIVEDataset": (584, 565),
    "STAREDataset": (605, 700),
    "ChaseDB1Dataset": (960, 999),
    "HRFDataset": (2336, 3504),
    "SynapseDataset": (512, 512),
    "NYUDataset": (480, 640),
    "ADE20KDataset": None,
    "PascalVOCDataset": None,
    "PascalContextDataset": None,
    "PascalContextDataset59": None,
    "COCOStuffDataset": None,
    "LIPDataset": None,
    "MapillaryDataset_v1": None,
    "MapillaryDataset_v2": None,
}
#: Width over height of photos where sizes vary: landscape, portrait and square, as a
#: photo collection mixes them (ADE20K's are mostly 4:3 and 3:4, with every other).
ASPECTS = (4 / 3, 3 / 4, 1.0, 3 / 2, 2 / 3, 16 / 9, 5 / 4, 4 / 5, 16 / 10, 2.0, 9 / 16, 7 / 5)
#: Header-read sizes of the user's images taken at most (spread over the folder).
LOCAL_SAMPLE = 200
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp", ".webp")


def local_sizes(dataset_cfg: dict, limit: int = LOCAL_SAMPLE) -> List[Tuple[int, int]]:
    """``(h, w)`` of up to ``limit`` of the user's own images (the config's data_root and
    image folder), from their headers (PIL opens a file lazily: nothing is decoded); empty
    when the folder is not on this host."""
    from PIL import Image

    inner = inner_dataset(dataset_cfg)
    prefix = (inner.get("data_prefix") or {}).get("img_path", "")
    folder = osp.join(inner.get("data_root") or "", prefix)
    if not (inner.get("data_root") or prefix) or not osp.isdir(folder):
        return []
    names = sorted(n for n in os.listdir(folder) if n.lower().endswith(IMAGE_SUFFIXES))
    step = max(1, len(names) // limit)
    sizes = []
    for name in names[::step][:limit]:
        try:
            with Image.open(osp.join(folder, name)) as image:
                width, height = image.size
        except OSError:
            continue
        sizes.append((height, width))
    return sizes


def val_sizes(
    dataset_cfg: dict, count: int, side: int, factor: float
) -> Tuple[List[Tuple[int, int]], str]:
    """``count`` validation image sizes and where they come from: the user's own images
    (times ``factor``), else the dataset's one size (times ``factor``), else photos of
    varied aspect ratios whose shorter side is ``side``."""

    def scaled(h: int, w: int) -> Tuple[int, int]:
        return max(8, round(h * factor)), max(8, round(w * factor))

    local = local_sizes(dataset_cfg)
    if local:
        picked = [local[(i * len(local)) // count] for i in range(count)]
        return [scaled(h, w) for h, w in picked], f"the sizes of {len(local)} of your images"
    kind = inner_dataset(dataset_cfg).get("type", "")
    known = DATASET_SIZES.get(kind)
    if known is not None:
        return [scaled(*known)] * count, f"{kind}'s one size, {known[0]} x {known[1]}"
    sizes = []
    for i in range(count):
        aspect = ASPECTS[i % len(ASPECTS)]
        h, w = (side, round(side * aspect)) if aspect >= 1 else (round(side / aspect), side)
        sizes.append((h, w))
    what = kind if kind in DATASET_SIZES else f"{kind or 'the dataset'} (not known: taken as)"
    return sizes, f"{what} photos of {len(set(sizes))} aspect ratios"


def write_split(
    root: str,
    split: str,
    sizes: List[Tuple[int, int]],
    classes: int,
    facts: dict,
    ignore_index: int = IGNORE_INDEX,
    seed: int = 0,
) -> None:
    """An image/mask pair of each size ``(h, w)`` for ``split``, and its list."""
    import cv2

    rng = np.random.RandomState(seed)
    img_dir, ann_dir = osp.join(root, "img_dir", split), osp.join(root, "ann_dir", split)
    os.makedirs(img_dir, exist_ok=True)
    os.makedirs(ann_dir, exist_ok=True)
    palette = rng.randint(0, 256, size=(max(classes, 1), 3))
    names = []
    for i, (height, width) in enumerate(sizes):
        cells = 4
        grid = rng.randint(0, classes, size=(cells, cells))
        cell = max(height, width) // cells + 1
        labels = np.kron(grid, np.ones((cell, cell), dtype=np.int64))[:height, :width]
        image = palette[labels] + rng.randint(-20, 21, size=(height, width, 3))
        mask = labels + 1 if facts["reduce_zero_label"] else labels.copy()
        # a border the loss ignores (label 0 where the dataset reduces it to the ignore
        # index), of a depth of its own: real masks' ignored areas differ from image to image
        depth = rng.randint(1, max(2, height // 6))
        mask[:depth, :] = 0 if facts["reduce_zero_label"] else ignore_index
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
    sizes: List[Tuple[int, int]],
    model: dict,
    seed: int = 0,
) -> dict:
    """Write ``split`` of the synthetic set under ``root`` for the dataset ``dataset_cfg``
    reads (its class's suffixes and label reduction), an image of each size ``(h, w)``,
    with the labels the model predicts and its ignore index; return what was written."""
    facts = dataset_facts(dataset_cfg)
    head = head_of(model)
    known = [c for c in (head.get("num_classes"), facts["classes"]) if c]
    classes = min(known) if known else 2
    ignore_index = int(head.get("ignore_index", IGNORE_INDEX))
    write_split(root, split, sizes, classes, facts, ignore_index, seed)
    return dict(facts, labels=classes, ignore_index=ignore_index, count=len(sizes))


def head_of(model: dict) -> dict:
    """The model's decode head (the last of a cascade: it predicts), or ``{}``."""
    head = model.get("decode_head")
    if isinstance(head, (list, tuple)):
        head = head[-1]
    return head or {}


def write_rehearsal_data(
    cfg, derived: dict, changes: dict, root: str, ranks: int, scale: str
) -> str:
    """The synthetic train and val sets of a rehearsal of ``cfg`` on ``ranks`` cards at
    ``scale`` (``derived`` and ``changes``: :func:`~.plan.derive`'s), under ``root``; the
    note that says what they are."""
    loader = derived["train_dataloader"]
    side = changes["image_side"]
    count = ranks * int(loader.get("batch_size", 1))
    written = write_dataset(
        root, loader["dataset"], "train", [(side, side)] * count, derived["model"]
    )
    val = "no val"
    if changes["has_val"]:
        per_rank = VAL_IMAGES_PER_CARD if scale == "small" else REAL_VAL_IMAGES
        sizes, where = val_sizes(
            cfg.val_dataloader.dataset, ranks * per_rank, side, changes["factor"]
        )
        dataset = derived["val_dataloader"]["dataset"]
        write_dataset(root, dataset, "val", sizes, derived["model"], seed=1)
        val = f"{len(sizes)} val images of {len(set(sizes))} sizes ({where})"
    return (
        f"data: synthetic {written['type']} ({written['labels']} labels, ignore index "
        f"{written['ignore_index']}, {written['count']} train images of {side} px, {val}) "
        "through the config's own pipelines; data loaders with num_workers=0"
    )
