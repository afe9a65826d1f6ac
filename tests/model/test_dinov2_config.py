"""The shipped DINOv2-S/14 UPerNet config (mmpretrain's VisionTransformer in an mmseg model)
on the T20 stack: it loads with its custom_imports, builds, runs a crop on the CPU, and takes
mmpretrain's DINOv2 checkpoint from its local path. tests/configs checks it like every other
config on the main leg, where its model cannot be built.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

if torch.__version__.split(".")[0] != "1" and importlib.util.find_spec("mmpretrain") is None:
    # Only here: on the T20 leg tools/install_t20.sh installs mmpretrain, so missing it fails.
    pytest.skip(
        "no torchvision build matches torch 2.13, so mmpretrain cannot be imported on this leg",
        allow_module_level=True,
    )

from mmengine.config import Config  # noqa: E402
from mmengine.model import revert_sync_batchnorm  # noqa: E402
from mmengine.registry import DefaultScope  # noqa: E402

from tests.conftest import one_worker

# The module-scoped runs are made once: the module runs on one xdist worker.
pytestmark = one_worker(__name__)

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "dinov2" / "upernet_dinov2-s14_8xgcu-80k_loveda-518x518.py"
CROP = 518
GRID = CROP // 14  # 37x37 patches, the grid DINOv2 was pre-trained at


@pytest.fixture(scope="module")
def cfg():
    # Imports mmgcu and mmpretrain.models, as a run does; the type must resolve from mmseg.
    return Config.fromfile(str(CONFIG))


def build(cfg, scope="mmseg"):
    from mmseg.registry import MODELS

    with DefaultScope.overwrite_default_scope(scope):
        return MODELS.build(cfg)


def test_model_builds_and_runs_a_crop(cfg):
    from mmpretrain.models import VisionTransformer

    model = build(cfg.model)
    assert type(model.backbone) is VisionTransformer
    # torch 1.10's SyncBatchNorm refuses CPU tensors even in eval (on cards, GCURunner swaps
    # it for GCUSyncBatchNorm).
    model = revert_sync_batchnorm(model).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        image = torch.rand(1, 3, CROP, CROP)
        feats = model.backbone(image)
        logits = model(image, mode="tensor")
    assert [tuple(f.shape) for f in feats] == [(1, 384, GRID, GRID)] * 4
    # UPerNet's logits at the neck's finest level (4x the patch grid).
    assert tuple(logits.shape) == (1, 7, 4 * GRID, 4 * GRID)
    assert torch.isfinite(logits).all()


def test_pretrained_checkpoint_loads_from_its_local_path(cfg, tmp_path, monkeypatch):
    """mmpretrain's DINOv2-S checkpoint is the state dict of its own headless ImageClassifier
    config: one saved from that model loads into every backbone weight, unresized."""
    import mmpretrain
    from mmpretrain.registry import MODELS as PRETRAIN_MODELS

    headless = Path(mmpretrain.__file__).parent / ".mim" / "configs" / "dinov2"
    reference = Config.fromfile(str(headless / "vit-small-p14_dinov2-pre_headless.py"))
    with DefaultScope.overwrite_default_scope("mmpretrain"):
        classifier = PRETRAIN_MODELS.build(reference.model)
    torch.manual_seed(0)
    for p in classifier.parameters():
        torch.nn.init.normal_(p)
    path = tmp_path / cfg.pretrained
    path.parent.mkdir(parents=True)
    torch.save({"state_dict": classifier.state_dict()}, str(path))

    model = build(cfg.model)
    assert model.backbone.init_cfg["checkpoint"] == cfg.pretrained
    monkeypatch.chdir(tmp_path)  # the path is relative to where training starts
    model.init_weights()

    saved = {
        k[len("backbone.") :]: v
        for k, v in classifier.state_dict().items()
        if k.startswith("backbone.")
    }
    loaded = model.backbone.state_dict()
    assert sorted(loaded) == sorted(saved)
    for key, value in saved.items():
        assert torch.equal(loaded[key], value), key
