"""The shipped DINOv2 UPerNet configs, ViT-S/14 and ViT-L/14 (mmpretrain's
VisionTransformer in an mmseg model), on the T20 stack: each loads with its custom_imports,
builds the backbone mmpretrain's DINOv2 checkpoint was converted from, runs a crop on the
CPU, and takes that checkpoint from its local path. tests/configs checks them like every
other config on the main leg, where their models cannot be built.
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
CROP = 518
GRID = CROP // 14  # 37x37 patches, the grid DINOv2 was pre-trained at
#: Each shipped config, the mmpretrain model its checkpoint is the state dict of (its
#: headless config), and what the backbone is.
CASES = {
    "s14": dict(
        config="upernet_dinov2-s14_8xgcu-80k_loveda-518x518.py",
        headless="vit-small-p14_dinov2-pre_headless.py",
        checkpoint="vit-small-p14_dinov2-pre_3rdparty_20230426-5641ca5a.pth",
        dims=384,
        layers=12,
        out_indices=(2, 5, 8, 11),
    ),
    "l14": dict(
        config="upernet_dinov2-l14_8xgcu-80k_loveda-518x518.py",
        headless="vit-large-p14_dinov2-pre_headless.py",
        checkpoint="vit-large-p14_dinov2-pre_3rdparty_20230426-f3302d9e.pth",
        dims=1024,
        layers=24,
        out_indices=(5, 11, 17, 23),
    ),
}


@pytest.fixture(scope="module", params=["s14", pytest.param("l14", marks=pytest.mark.long)])
def case(request):
    # Imports mmgcu and mmpretrain.models, as a run does; the type must resolve from mmseg.
    found = dict(CASES[request.param])
    found["cfg"] = Config.fromfile(str(REPO / "configs" / "dinov2" / found["config"]))
    return found


def build(cfg, scope="mmseg"):
    from mmseg.registry import MODELS

    with DefaultScope.overwrite_default_scope(scope):
        return MODELS.build(cfg)


def test_model_builds_and_runs_a_crop(case):
    from mmpretrain.models import VisionTransformer

    cfg, dims = case["cfg"], case["dims"]
    model = build(cfg.model)
    assert type(model.backbone) is VisionTransformer
    assert (model.backbone.embed_dims, model.backbone.num_layers) == (dims, case["layers"])
    assert tuple(model.backbone.out_indices) == case["out_indices"]
    assert model.backbone.patch_embed.projection.kernel_size == (14, 14)
    # torch 1.10's SyncBatchNorm refuses CPU tensors even in eval (on cards, GCURunner swaps
    # it for GCUSyncBatchNorm).
    model = revert_sync_batchnorm(model).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        image = torch.rand(1, 3, CROP, CROP)
        feats = model.backbone(image)
        logits = model(image, mode="tensor")
    assert [tuple(f.shape) for f in feats] == [(1, dims, GRID, GRID)] * 4
    # UPerNet's logits at the neck's finest level (4x the patch grid).
    assert tuple(logits.shape) == (1, 7, 4 * GRID, 4 * GRID)
    assert torch.isfinite(logits).all()


def test_pretrained_checkpoint_loads_from_its_local_path(case, tmp_path, monkeypatch):
    """mmpretrain's DINOv2 checkpoint is the state dict of its own headless ImageClassifier
    config: one saved from that model loads into every backbone weight, unresized."""
    import mmpretrain
    from mmpretrain.registry import MODELS as PRETRAIN_MODELS

    cfg = case["cfg"]
    assert cfg.pretrained == f"pretrain/{case['checkpoint']}"
    headless = Path(mmpretrain.__file__).parent / ".mim" / "configs" / "dinov2"
    reference = Config.fromfile(str(headless / case["headless"]))
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


def test_the_large_config_is_the_small_ones_recipe_with_dinov2s_vit_l():
    small, large = (
        Config.fromfile(str(REPO / "configs" / "dinov2" / CASES[name]["config"]))
        for name in ("s14", "l14")
    )
    same = ("optim_wrapper", "param_scheduler", "train_dataloader", "val_dataloader")
    same += ("train_cfg", "auto_scale_lr", "env_cfg", "model_wrapper_cfg", "custom_imports")
    for key in same:
        assert small[key] == large[key], key
    backbone = large.model.backbone
    # mmpretrain's DINOv2 ViT-L/14 (its headless config): arch 'large', patch 14, layer scale
    assert (backbone.arch, backbone.patch_size, backbone.layer_scale_init_value) == (
        "large",
        14,
        1e-5,
    )
    assert backbone.init_cfg == dict(
        type="Pretrained", checkpoint=large.pretrained, prefix="backbone."
    )
    assert large.model.neck.in_channels == [1024] * 4 and large.model.neck.out_channels == 1024
    assert large.model.decode_head.in_channels == [1024] * 4
    assert large.model.auxiliary_head.in_channels == 1024
    assert large.model.test_cfg == small.model.test_cfg
