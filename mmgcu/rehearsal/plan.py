"""The rehearsal's config: the user's, with offline data, local weights and a short schedule.

Everything a card runs is left as the user wrote it (model, runner, optimizer, AMP, SyncBN,
hooks); what changes is what a T20 host without the user's dataset and network cannot give
and what a rehearsal need not repeat:

- every dataloader reads the synthetic set (:mod:`mmgcu.rehearsal.data`) through the
  config's own dataset class and pipeline, with ``num_workers=0`` (host-side only);
- pretrained weights named by a URL or by a path that is not there are dropped (random
  initialisation), so nothing is fetched;
- the schedule is ``iters`` iterations, one validation and a checkpoint at the end, a log
  line every iteration;
- ``scale='real'`` keeps the config's crops and runs one rank (:func:`ranks`): one simulated
  card is a card's worth of host memory, and what the other ranks of the configured world
  add to each card is worked out (:mod:`mmgcu.rehearsal.memory`). Its resume job trains its
  one iteration at the small scale's crop (:func:`resume_derive`): the step after the first
  at the config's crop is the train job's figure, and the host need not hold it twice;
- ``scale='small'`` divides every crop, resize scale and sliding window by one factor, so
  the largest crop side is :data:`SMALL_SIDE`; backbones that build their position tables
  for an ``img_size`` (:data:`SIZED_BY_IMG_SIZE`) get it divided by the same factor, and
  a layer that needs a least input (:data:`LEAST_SIDE`) stops the factor there, with the
  training crop at that least side on both axes (not the config's aspect: the crop's
  longer side would cost time and prove nothing more).
"""

import copy
import os.path as osp
from typing import Any, Callable, Dict, List, Optional, Tuple

#: The largest crop side at ``scale='small'``: a step in seconds on a CPU, and deep enough
#: for an output stride of 32.
SMALL_SIDE = 128
#: Backbones whose position tables are built for their ``img_size`` and not resized to
#: the input at run time (beit.py, mae.py: a table per patch of ``img_size``): at the small
#: scale their ``img_size`` shrinks with the crop. Their pretrained weights still load:
#: mmseg resizes a checkpoint's tables to the model's (``resize_rel_pos_embed``, and MAE's
#: ``resize_abs_pos_embed``).
SIZED_BY_IMG_SIZE = {
    "BEiT": "BEiT's relative position tables",
    "MAE": "MAE's position tables",
}
#: Layers with a window of constant size, and the least crop side (px) it fits: at the small
#: scale the crop shrinks no further than that.
LEAST_SIDE = {
    # lraspp_head.py: nn.AvgPool2d(kernel_size=49, stride=(16, 20)) on the backbone's
    # stride-8 features, which fails below 49 x 49 ("Output size is too small").
    "LRASPPHead": (49 * 8, "LRASPP's 49 x 49 pooling window on stride-8 features"),
}
DEFAULT_CROP = (512, 512)
#: The simulated hardware unless told (``mmgcu rehearse --hardware``).
DEFAULT_HARDWARE = "t20"
#: A T20 card's memory, what the peaks are compared with by default.
T20_MEMORY_GIB = 32
HOOK = "mmgcu.rehearsal.hook"
#: The module of the hook that records what a card's memory figure needs.
MEMORY_HOOK = "mmgcu.rehearsal.memory"
#: Training iterations by default, by scale: at the small scale three (on a lazy card the
#: first two compile); at real scale one, minutes on a CPU, which with the optimizer
#: state and gradients measured after it gives the figure of every later step.
DEFAULT_ITERS = {"small": 3, "real": 1}
#: Validation images per rank at real scale: the memory of one (at the config's crop);
#: the small scale's images show what each new input shape costs a lazy card.
REAL_VAL_IMAGES = 1
#: Dataset wrappers whose inner dataset the rehearsal reads (the first one of a concat).
WRAPPERS = ("RepeatDataset", "ClassBalancedDataset", "ConcatDataset", "MultiImageMixDataset")
LOADERS = ("train_dataloader", "val_dataloader", "test_dataloader")
SPLITS = {"train_dataloader": "train", "val_dataloader": "val", "test_dataloader": "val"}


def ranks(scale: str, cards: int) -> int:
    """The ranks a rehearsal runs: every card at the small scale; one at real scale, whose
    card stands for each card of the ``cards`` of the job."""
    return cards if scale == "small" else 1


def pair(value) -> Tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, (int, float)) else tuple(value)


def inner_dataset(dataset: dict) -> dict:
    """The dataset a (possibly wrapped) dataset config reads its samples from."""
    while dataset.get("type") in WRAPPERS:
        inner = dataset.get("dataset") or dataset.get("datasets")
        dataset = inner[0] if isinstance(inner, (list, tuple)) else inner
    return dataset


def crop_of(cfg) -> Tuple[int, int]:
    """The training crop ``(h, w)``: the model's data preprocessor size, else the train
    pipeline's ``RandomCrop``, else 512 x 512."""
    size = (cfg.get("model", {}).get("data_preprocessor") or {}).get("size")
    if size:
        return pair(size)
    loader = cfg.get("train_dataloader") or {}
    for step in inner_dataset(loader.get("dataset", {})).get("pipeline", []):
        if step.get("type") == "RandomCrop":
            return pair(step["crop_size"])
    return DEFAULT_CROP


def image_side(cfg, factor: float) -> int:
    """The synthetic images' side: the shorter side of the train pipeline's resize scale
    (the size mmseg's configs resize a dataset's images to), else the crop's longer side."""
    loader = cfg.get("train_dataloader") or {}
    for step in inner_dataset(loader.get("dataset", {})).get("pipeline", []):
        if step.get("type") in ("Resize", "RandomResize", "RandomChoiceResize") and step.get(
            "scale"
        ):
            scale = step["scale"]
            if isinstance(scale, (list, tuple)) and scale and isinstance(scale[0], (list, tuple)):
                scale = scale[0]
            return max(8, round(min(pair(scale)) * factor))
    return max(8, round(max(crop_of(cfg)) * factor))


def kind_of(part: dict) -> str:
    """The class a config part builds, without its registry scope (``mmseg.BEiT``: BEiT)."""
    return str(part.get("type", "")).split(".")[-1]


def scale_factor(cfg, scale: str) -> Tuple[float, Optional[str]]:
    """The factor crops are multiplied by, and why, when a layer keeps it above the small
    scale's."""
    if scale == "real":
        return 1.0, None
    crop = crop_of(cfg)
    factor, why = min(1.0, SMALL_SIDE / max(crop)), None
    for side, window in least_sides(cfg):
        least = min(1.0, side / min(crop))
        if least > factor:
            factor = least
            what = f"the crop stops at {side} px a side" if least < 1.0 else None
            why = f"{what or 'the crop is kept'}: {window} needs {side} px a side"
    return factor, why


def least_sides(cfg) -> List[Tuple[int, str]]:
    """``(side, why)`` of each layer of the model in :data:`LEAST_SIDE`."""
    model = cfg.get("model", {})
    heads = model.get("decode_head") or {}
    parts = [model.get("backbone") or {}] + (list(heads) if isinstance(heads, list) else [heads])
    return [LEAST_SIDE[kind_of(part)] for part in parts if kind_of(part) in LEAST_SIDE]


def crop_limit(cfg, scale: str) -> Optional[int]:
    """The longest side a training crop keeps at ``scale``: at the small scale
    :data:`SMALL_SIDE`, or the least side a layer needs when that is more."""
    if scale == "real":
        return None
    return max([SMALL_SIDE] + [side for side, _ in least_sides(cfg)])


def _each_side(value, side: Callable[[float], int]):
    """A size (a number, a pair, or a list of pairs) with ``side`` applied to each side."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return side(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_each_side(v, side) for v in value)
    return value


def _sizes_below(node: Any, keys, side: Callable[[float], int]) -> Any:
    """``node`` with ``side`` applied to every side of each size under one of ``keys``."""
    if isinstance(node, dict):
        return {
            key: _each_side(value, side) if key in keys else _sizes_below(value, keys, side)
            for key, value in node.items()
        }
    if isinstance(node, (list, tuple)):
        return type(node)(_sizes_below(v, keys, side) for v in node)
    return node


def _at_most(limit: int) -> Callable[[float], int]:
    return lambda side: min(side, limit)


def _times(factor: float) -> Callable[[float], int]:
    return lambda side: max(8, round(side * factor))


def _limited(value, limit: int):
    """A size at most ``limit`` px a side."""
    return _each_side(value, _at_most(limit))


def limit_crops(node: Any, limit: int) -> Any:
    """Every ``crop_size`` and pad ``size`` below ``node`` (a train pipeline, a data
    preprocessor) at most ``limit`` px a side."""
    return _sizes_below(node, ("crop_size", "size"), _at_most(limit))


def _scaled(value, factor: float):
    """A size (int, pair, or a list of pairs) multiplied by ``factor``, at least 8."""
    return _each_side(value, _times(factor))


SIZE_KEYS = ("scale", "scales", "img_scale", "max_size", "crop_size", "size", "stride")


def shrink(node: Any, factor: float, keys=SIZE_KEYS) -> Any:
    """Every crop size, resize scale and sliding window below ``node`` times ``factor``
    (``node``: a pipeline, a data preprocessor or a ``test_cfg``)."""
    if factor == 1.0:
        return node
    return _sizes_below(node, keys, _times(factor))


def shrink_model(model: dict, factor: float, notes: List[str]) -> dict:
    """The model's input size (its data preprocessor's pad size, its sliding window) times
    ``factor``, and the ``img_size`` of a backbone in :data:`SIZED_BY_IMG_SIZE` (said in
    ``notes``); its other layers are untouched."""
    model = dict(model)
    for key in ("data_preprocessor", "test_cfg"):
        if model.get(key):
            model[key] = shrink(model[key], factor)
    backbone = model.get("backbone") or {}
    kind = kind_of(backbone)
    if factor != 1.0 and kind in SIZED_BY_IMG_SIZE and "img_size" in backbone:
        size = backbone["img_size"]
        model["backbone"] = dict(backbone, img_size=_scaled(size, factor))
        notes.append(
            f"scale small: {kind}'s img_size {size} -> {model['backbone']['img_size']} "
            f"with the crop ({SIZED_BY_IMG_SIZE[kind]} are built for it)"
        )
    return model


def is_local(path) -> bool:
    return isinstance(path, str) and "://" not in path and osp.isfile(path)


def drop_missing_weights(node: Any, found: List[str], where: str = "model") -> Any:
    """``node`` without pretrained weights that are not a local file (a URL, or a path that is
    not there); each one dropped is added to ``found``."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            here = f"{where}.{key}"
            if key == "pretrained" and isinstance(value, str) and not is_local(value):
                found.append(f"{here} = {value!r}")
                out[key] = None
            elif (
                key == "init_cfg"
                and isinstance(value, dict)
                and value.get("type") == "Pretrained"
                and not is_local(value.get("checkpoint"))
            ):
                found.append(f"{here}.checkpoint = {value.get('checkpoint')!r}")
                out[key] = None
            else:
                out[key] = drop_missing_weights(value, found, here)
        return out
    if isinstance(node, (list, tuple)):
        return type(node)(drop_missing_weights(v, found, where) for v in node)
    return node


def synthetic_dataset(dataset: dict, data_root: str, split: str) -> dict:
    """``dataset`` with each dataset it reads (itself, or those a wrapper holds) reading the
    synthetic ``split`` through its own class and pipeline; wrappers are kept (their own
    pipelines too), a repeat once."""
    dataset = copy.deepcopy(dataset)
    if dataset.get("type") in WRAPPERS:
        if "dataset" in dataset:
            dataset["dataset"] = synthetic_dataset(dataset["dataset"], data_root, split)
        if "datasets" in dataset:
            dataset["datasets"] = [
                synthetic_dataset(d, data_root, split) for d in dataset["datasets"]
            ]
        if "times" in dataset:
            dataset["times"] = 1
        return dataset
    dataset.update(
        data_root=data_root,
        data_prefix=dict(img_path=f"img_dir/{split}", seg_map_path=f"ann_dir/{split}"),
        ann_file=f"{split}.txt",
    )
    dataset.pop("indices", None)
    return dataset


def _weights(out: Dict[str, Any], factor: float, limit: Optional[int], notes: List[str]) -> None:
    """The model without pretrained weights that are not local files (nor ``load_from``),
    its input sizes times ``factor`` and its pad size at most ``limit`` px a side."""
    dropped: List[str] = []
    out["model"] = shrink_model(drop_missing_weights(out["model"], dropped), factor, notes)
    if limit and out["model"].get("data_preprocessor"):
        preprocessor = out["model"]["data_preprocessor"]
        out["model"]["data_preprocessor"] = limit_crops(preprocessor, limit)
    if out.get("load_from") and not is_local(out["load_from"]):
        dropped.append(f"load_from = {out['load_from']!r}")
        out["load_from"] = None
    if dropped:
        notes.append(
            "pretrained weights not found locally (nothing is downloaded): random "
            "initialisation in place of " + "; ".join(dropped)
        )


def _loaders(out: Dict[str, Any], data_root: str, factor: float, limit: Optional[int]) -> None:
    """Every data loader on the synthetic set, its sizes times ``factor`` (the training
    crop at most ``limit`` px a side), with no worker process."""
    for name in LOADERS:
        loader = out.get(name)
        if not loader:
            continue
        loader = dict(loader)
        dataset = synthetic_dataset(loader["dataset"], data_root, SPLITS[name])
        loader["dataset"] = shrink(dataset, factor)
        if limit and name == "train_dataloader":
            loader["dataset"] = limit_crops(loader["dataset"], limit)
        loader.update(num_workers=0, persistent_workers=False)
        out[name] = loader


def _schedule(out: Dict[str, Any], iters: int, notes: List[str]) -> None:
    """``iters`` iterations, one validation and a checkpoint at the end (in the work dir,
    under its usual name), a log line every iteration."""
    loop = (out.get("train_cfg") or {}).get("type", "IterBasedTrainLoop")
    if "Iter" not in str(loop):
        notes.append(
            f"schedule: {loop} replaced by IterBasedTrainLoop for {iters} iteration(s); "
            "schedulers stepped by epoch do not step"
        )
    out["train_cfg"] = dict(type="IterBasedTrainLoop", max_iters=iters, val_interval=iters)
    if out.get("val_dataloader") and not out.get("val_cfg"):
        out["val_cfg"] = dict(type="ValLoop")
    hooks = dict(out.get("default_hooks") or {})
    checkpoint = dict(hooks.get("checkpoint") or dict(type="CheckpointHook"))
    checkpoint.update(by_epoch=False, interval=iters, save_best=None, max_keep_ckpts=-1)
    # In the work dir under its usual name: not the user's checkpoint store (out_dir, a
    # remote backend), which the rehearsal must not write to.
    for key in ("out_dir", "filename_tmpl", "backend_args", "file_client_args"):
        checkpoint.pop(key, None)
    hooks["checkpoint"] = checkpoint
    hooks["logger"] = dict(hooks.get("logger") or dict(type="LoggerHook"), interval=1)
    out["default_hooks"] = hooks
    out["log_processor"] = dict(out.get("log_processor") or {}, by_epoch=False)


def _recorded(out: Dict[str, Any]) -> None:
    """The rehearsal's hooks and their modules, a fixed seed, local files only (no
    experiment tracker is reached), and no resume of the user's."""
    hooks = [dict(type="RehearsalHook"), dict(type="RehearsalMemoryHook")]
    out["custom_hooks"] = list(out.get("custom_hooks") or []) + hooks
    imports = dict(out.get("custom_imports") or dict(imports=[]))
    names = imports.get("imports") or []
    names = [names] if isinstance(names, str) else list(names)
    imports["imports"] = names + [HOOK, MEMORY_HOOK]
    out["custom_imports"] = imports
    out["randomness"] = dict(out.get("randomness") or {}, seed=0)
    if out.get("visualizer"):
        out["visualizer"] = dict(out["visualizer"], vis_backends=[dict(type="LocalVisBackend")])
    out.pop("vis_backends", None)
    out["resume"] = False


def derive(cfg, data_root: str, iters: int, scale: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The rehearsal's config as a dict (``Config(...)`` of it runs), and what was changed:
    ``{'crop': (h, w), 'config_crop': (h, w), 'image_side': int, 'factor': float,
    'notes': [str, ...], 'has_val': bool}``."""
    notes: List[str] = []
    factor, why = scale_factor(cfg, scale)
    if why:
        notes.append(f"scale small: {why}")
    limit = crop_limit(cfg, scale)
    crop = tuple(round(c * factor) for c in crop_of(cfg))
    if limit:
        crop = _limited(crop, limit)
    out = cfg.to_dict() if hasattr(cfg, "to_dict") else copy.deepcopy(dict(cfg))
    _weights(out, factor, limit, notes)
    _loaders(out, data_root, factor, limit)
    _schedule(out, iters, notes)
    _recorded(out)
    has_val = bool(out.get("val_dataloader") and out.get("val_evaluator"))
    changes = dict(crop=crop, config_crop=crop_of(cfg), image_side=image_side(cfg, factor))
    return out, dict(changes, factor=factor, notes=notes, has_val=has_val)


def resume_derive(cfg, data_root: str, iters: int) -> Tuple[Optional[Dict[str, Any]], str]:
    """The resume job's config at real scale, and what it changes: the small scale's crops
    with the same model, so the resumed step holds the loaded optimizer state and the
    gradients beside a small crop's activations; None (the train job's config, the
    config's crops) where the backbone's tables are built for its ``img_size``
    (:data:`SIZED_BY_IMG_SIZE`), which a checkpoint of the real scale fixes."""
    kind = kind_of(cfg.get("model", {}).get("backbone") or {})
    if kind in SIZED_BY_IMG_SIZE:
        return None, (
            f"resume at the config's crop: {SIZED_BY_IMG_SIZE[kind]} are built for its "
            "img_size, which the checkpoint fixes"
        )
    out, changes = derive(cfg, data_root, iters, "small")
    crop = "x".join(str(c) for c in changes["crop"])
    if changes["crop"] == changes["config_crop"]:
        return None, f"resume at the config's crop {crop} (no larger than the small scale's)"
    return out, (
        f"resume: one iteration at the small scale's crop {crop} from the real scale's "
        "checkpoint (the loaded optimizer state and gradients on the card; the step after "
        "the first at the config's crop is the train job's figure)"
    )
