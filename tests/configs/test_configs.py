"""The configs under configs/ (all but _base_/): each loads, inherits the GCU runtime, sets
its batch and lr for the 8 cards of a T20 server, and builds and runs its model and
pipelines on the CPU without touching the network.

A config may import another OpenMMLab model library (``custom_imports``): it loads and is
checked on every leg, and its model is built where that library imports.

Every config is loaded once (``Config.fromfile`` is the slow part) and copied per test.
"""

import contextlib
import copy
import functools
import importlib.util
import os
import re
import socket
from pathlib import Path
from unittest import mock

import cv2
import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmengine.utils import import_modules_from_strings
from mmseg.registry import DATASETS, MODELS, TRANSFORMS
from mmseg.utils import register_all_modules

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "configs"
GCU_RUNTIME = CONFIG_DIR / "_base_" / "gcu_runtime.py"
CARDS = 8  # one T20 server

CONFIGS = sorted(
    p.relative_to(CONFIG_DIR).as_posix()
    for p in CONFIG_DIR.rglob("*.py")
    if "_base_" not in p.relative_to(CONFIG_DIR).parts
)
REQUIRED = [
    "deeplabv3plus/deeplabv3plus_r50-d8_8xgcu-80k_loveda-512x512.py",
    "upernet/upernet_vit-b16_8xgcu-80k_loveda-512x512.py",
    "dinov2/upernet_dinov2-s14_8xgcu-80k_loveda-518x518.py",
    "dinov2/upernet_dinov2-l14_8xgcu-80k_loveda-518x518.py",
]
# Configs that are no lr recipe and so set no auto_scale_lr, with the reason.
NO_AUTO_SCALE_LR = {
    "tiny/fcn_r18-tiny_8xgcu_synthetic-64x64.py": "the 4-iteration e2e config",
    "tiny/fcn_r18-tiny-d8_8xgcu-40it_synthetic-64x64.py": "the demo, tuned for 8 cards",
}

# Model libraries a config may import beyond mmgcu, and why a leg may not have them.
WHY_MISSING = {
    "mmpretrain": "no torchvision build matches torch 2.13, so mmpretrain cannot be imported "
    "on this leg"
    if torch.__version__.split(".")[0] != "1"
    else "mmpretrain is not installed (tools/install_t20.sh installs it)",
}

register_all_modules(init_default_scope=False)


@pytest.fixture(autouse=True)
def mmseg_scope():
    """Build under the 'mmseg' default scope, as the runner does, then restore the scope."""
    with DefaultScope.overwrite_default_scope("mmseg"):
        yield


class NetworkAccess(AssertionError):
    pass


@contextlib.contextmanager
def offline():
    """Refuse (and record) every connection and name lookup; fail if anything tried one,
    even if the caller swallowed the error."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise NetworkAccess(f"network access attempted: {args!r}")

    with contextlib.ExitStack() as stack:
        for owner, name in [
            (socket.socket, "connect"),
            (socket.socket, "connect_ex"),
            (socket, "create_connection"),
            (socket, "getaddrinfo"),
        ]:
            stack.enter_context(mock.patch.object(owner, name, refuse))
        yield
    assert not attempts, f"network access attempted: {attempts}"


def missing_imports(cfg):
    """The packages of ``cfg``'s ``custom_imports`` that are not installed here."""
    return [
        m.split(".")[0]
        for m in cfg.custom_imports["imports"]
        if importlib.util.find_spec(m.split(".")[0]) is None
    ]


def skip_without_imports(name, cfg):
    for package in missing_imports(cfg):
        pytest.skip(f"{name}: {WHY_MISSING.get(package, f'{package} is not installed')}")


@functools.lru_cache(maxsize=None)
def _load(name):
    with offline():  # custom_imports and mmseg:: bases resolve locally too
        # As Config.fromfile would, but a config whose library this leg lacks still loads.
        cfg = Config.fromfile(str(CONFIG_DIR / name), import_custom_modules=False)
        if not missing_imports(cfg):
            import_modules_from_strings(**cfg.custom_imports)
        return cfg


def load(name):
    return copy.deepcopy(_load(name))


def strip_scope(value):
    """``value`` without the ``_scope_`` keys that mmseg:: bases add to typed dicts."""
    if isinstance(value, dict):
        return {k: strip_scope(v) for k, v in value.items() if k != "_scope_"}
    if isinstance(value, (list, tuple)):
        return [strip_scope(v) for v in value]
    return value


@functools.lru_cache(maxsize=None)
def gcu_owned_keys():
    """The keys gcu_runtime.py sets itself (beyond mmseg's default_runtime), with values."""
    import mmseg

    gcu = Config.fromfile(str(GCU_RUNTIME)).to_dict()
    stock_path = Path(mmseg.__file__).parent / ".mim" / "configs" / "_base_" / "default_runtime.py"
    stock = Config.fromfile(str(stock_path)).to_dict()
    return {
        k: strip_scope(v)
        for k, v in gcu.items()
        if k not in stock or strip_scope(v) != strip_scope(stock[k])
    }


def walk(value, path=""):
    """(path, key, value) for every dict entry under ``value``."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield path, k, v
            yield from walk(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from walk(v, f"{path}[{i}]")


def weight_paths(cfg):
    """Every pretrained-weight path the model config names (``pretrained``, ``checkpoint``)."""
    return [
        (f"model{p}.{k}", v)
        for p, k, v in walk(cfg.model)
        if k in ("pretrained", "checkpoint") and v is not None
    ]


def dataset_cfgs(cfg):
    """The dataset configs of the train, val and test loaders, by loader name."""
    return {
        key: copy.deepcopy(cfg[key]["dataset"])
        for key in ("train_dataloader", "val_dataloader", "test_dataloader")
        if cfg.get(key)
    }


def test_config_list():
    assert CONFIGS, f"no config under {CONFIG_DIR}"
    for name in REQUIRED:
        assert name in CONFIGS


def test_offline_guard_refuses_connections():
    with pytest.raises(NetworkAccess), offline():
        socket.create_connection(("download.openmmlab.com", 443), timeout=1)


@pytest.mark.parametrize("name", CONFIGS)
def test_inherits_gcu_runtime(name):
    cfg = load(name)
    assert cfg.runner_type == "GCURunner"
    assert "mmgcu" in cfg.custom_imports["imports"]
    assert cfg.default_scope == "mmseg"
    # What the GCU runtime sets (device, ECCL, GCU DDP, ...) wins over mmseg's runtime; a
    # config may import more modules, after the runtime's.
    for key, value in gcu_owned_keys().items():
        mine = strip_scope(cfg[key])
        if key == "custom_imports":
            n = len(value["imports"])
            mine = dict(mine, imports=mine["imports"][:n])
        assert mine == value, f"{name} changes {key} of gcu_runtime.py"


@pytest.mark.parametrize("name", CONFIGS)
def test_batch_scaled_for_8_cards(name):
    cfg = load(name)
    assert "8xgcu" in name, "config names say the cards they are set up for"
    per_card = cfg.train_dataloader.batch_size
    if name in NO_AUTO_SCALE_LR:
        pytest.skip(f"{name}: no auto_scale_lr ({NO_AUTO_SCALE_LR[name]})")
    assert cfg.auto_scale_lr.enable is False
    assert per_card * CARDS == cfg.auto_scale_lr.base_batch_size


@pytest.mark.parametrize("name", CONFIGS)
def test_pretrained_weights_are_local(name):
    for where, path in weight_paths(load(name)):
        assert isinstance(path, str), where
        assert "://" not in path and not os.path.isabs(path), f"{where}={path!r} is not local"
        assert path.startswith("pretrain/"), f"{where}={path!r}: keep weights under pretrain/"


@pytest.mark.parametrize("name", CONFIGS)
def test_num_classes_match_dataset(name):
    cfg = load(name)
    num_classes = cfg.model.decode_head.num_classes
    if cfg.model.get("auxiliary_head"):
        assert cfg.model.auxiliary_head.num_classes == num_classes
    for key, ds_cfg in dataset_cfgs(cfg).items():
        ds = DATASETS.build(dict(ds_cfg, lazy_init=True))  # reads no file
        assert len(ds.metainfo["classes"]) == num_classes, key


@pytest.mark.parametrize("name", CONFIGS)
def test_model_builds_offline_and_runs(name, tmp_path, monkeypatch):
    cfg = load(name)
    skip_without_imports(name, cfg)
    num_classes = cfg.model.decode_head.num_classes
    with offline():
        model = MODELS.build(cfg.model)
    model.eval()
    torch.manual_seed(0)
    # 64x64 is enough for every model here: a ViT-B/16 gets 4x4 patches and resizes its
    # position embedding, as it does for any size other than img_size.
    with torch.no_grad():
        logits = model(torch.rand(1, 3, 64, 64), mode="tensor")
    assert logits.ndim == 4 and logits.shape[:2] == (1, num_classes)
    assert torch.isfinite(logits).all()

    # Weights load only in init_weights (the runner calls it), from the local file: without
    # the file that is a FileNotFoundError naming it, never a download.
    monkeypatch.chdir(tmp_path)
    paths = [p for _, p in weight_paths(cfg)]
    with offline():
        if paths:
            with pytest.raises(FileNotFoundError, match="|".join(map(re.escape, paths))):
                model.init_weights()
        else:
            model.init_weights()


def _sample(tmp_path, num_classes, reduce_zero_label):
    """A 96x128 image and label map on disk, as the dataset would hand them over."""
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)
    # With reduce_zero_label, 0 is "no data" and 1..num_classes are the classes.
    low, high = (0, num_classes + 1) if reduce_zero_label else (0, num_classes)
    label = np.repeat(np.arange(low, high, dtype=np.uint8), 96 * 128 // (high - low) + 1)
    label = rng.permutation(label[: 96 * 128]).reshape(96, 128)
    cv2.imwrite(str(tmp_path / "img.png"), img)
    cv2.imwrite(str(tmp_path / "ann.png"), label)
    return dict(
        img_path=str(tmp_path / "img.png"),
        seg_map_path=str(tmp_path / "ann.png"),
        label_map=None,
        reduce_zero_label=reduce_zero_label,
        seg_fields=[],
    )


@pytest.mark.parametrize("name", CONFIGS)
def test_pipelines_build_and_run(name, tmp_path):
    cfg = load(name)
    num_classes = cfg.model.decode_head.num_classes
    for t in cfg.get("tta_pipeline") or []:
        TRANSFORMS.build(t)
    for key, ds_cfg in dataset_cfgs(cfg).items():
        pipeline = [TRANSFORMS.build(t) for t in ds_cfg.pipeline]
        ds = DATASETS.build(dict(ds_cfg, lazy_init=True))
        results = _sample(tmp_path, num_classes, ds.reduce_zero_label)
        for transform in pipeline:
            results = transform(results)
            assert results is not None, f"{key}: {transform} dropped the sample"
        inputs, sample = results["inputs"], results["data_samples"]
        assert inputs.dtype == torch.uint8 and inputs.shape[0] == 3, key
        for t in ds_cfg.pipeline:
            if t["type"] == "RandomCrop":
                assert inputs.shape[1] <= t["crop_size"][0], key
                assert inputs.shape[2] <= t["crop_size"][1], key
        labels = set(sample.gt_sem_seg.data.unique().tolist())
        assert labels <= set(range(num_classes)) | {255}, f"{key}: labels {labels}"


@pytest.mark.parametrize("name", CONFIGS)
def test_dataset_builds(name):
    cfg = load(name)
    data_root = cfg.train_dataloader.dataset.data_root
    root = Path(data_root) if os.path.isabs(data_root) else REPO / data_root
    if not root.is_dir():
        pytest.skip(f"{name}: dataset not on this machine: {data_root}")
    for key, ds_cfg in dataset_cfgs(cfg).items():
        ds_cfg.data_root = str(root)
        assert len(DATASETS.build(ds_cfg)) > 0, f"{key}: no sample under {root}"
