"""Model families of mmseg's zoo, small, on 2 simulated cards of this leg's generation, with
stock tools/train.py: 2 iterations, validation and a checkpoint.

- PSANet: mmseg's PSAHead calls mmcv's PSAMask, a compiled op with no card kernel
  ("psamask_forward_impl: implementation for device gcu:1 not found"); GCURunner runs it as
  GCUPSAMask.
- Segformer (MiT): its patch embedding's output is transposed before layer norm, which
  torch 1.10's composite layer norm views ("view size is not compatible with input tensor's
  size and stride" on the simulator's XLA card, where a T20's XLA device has no strides to
  refuse it).
"""

import pytest

from tests.e2e.conftest import LEG_DEVICE, finish, mmseg_tool, probes, torchrun, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.t20]

NORM = dict(type="SyncBN", requires_grad=True)
LOSS = dict(type="CrossEntropyLoss", use_sigmoid=False, loss_weight=1.0)
HEAD = dict(_delete_=True, num_classes=4, norm_cfg=NORM, align_corners=False, loss_decode=LOSS)
FAMILIES = {
    # The tiny FCN's backbone at output stride 8 (8x8 features of a 64x64 crop, 4x4 after
    # PSANet's shrink) under mmseg's PSAHead, both directions of attention.
    "psanet": dict(
        backbone=dict(strides=(1, 2, 1, 1), dilations=(1, 1, 2, 4)),
        decode_head=dict(
            HEAD,
            type="PSAHead",
            in_channels=128,
            in_index=3,
            channels=32,
            mask_size=(7, 7),
            psa_type="bi-direction",
            compact=False,
            shrink_factor=2,
            normalization_factor=1.0,
            psa_softmax=True,
            dropout_ratio=0.1,
        ),
    ),
    # mmseg's mit-b0 at a quarter of its width.
    "segformer": dict(
        backbone=dict(
            _delete_=True,
            type="MixVisionTransformer",
            in_channels=3,
            embed_dims=8,
            num_stages=4,
            num_layers=[1, 1, 1, 1],
            num_heads=[1, 2, 5, 8],
            patch_sizes=[7, 3, 3, 3],
            sr_ratios=[8, 4, 2, 1],
            out_indices=(0, 1, 2, 3),
            mlp_ratio=4,
            qkv_bias=True,
            drop_path_rate=0.1,
        ),
        decode_head=dict(
            HEAD,
            type="SegformerHead",
            in_channels=[8, 16, 40, 64],
            in_index=[0, 1, 2, 3],
            channels=32,
            dropout_ratio=0.1,
        ),
    ),
}


def train_family(tmp_path, dataset, family):
    """Stock train.py on 2 cards for 2 iterations; ``(exit code, output, work dir)``."""
    cfg = write_config(
        tmp_path / f"{family}.py",
        dataset,
        model=FAMILIES[family],
        train_cfg=dict(type="IterBasedTrainLoop", max_iters=2, val_interval=2),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", by_epoch=False, interval=2)),
    )
    work = str(tmp_path / "work")
    args = [mmseg_tool("train.py"), cfg, "--launcher", "pytorch", "--work-dir", work]
    code, out = finish(torchrun(args, nproc=2, cards=2))
    return code, out, work


def assert_trained_on_own_cards(out, work):
    reports = probes(work)
    assert sorted(reports) == [0, 1], out[-5000:]
    for rank, r in reports.items():
        assert r["param_devices"] == [f"{LEG_DEVICE}:{rank}"], r
        assert r["loss_devices"] == [f"{LEG_DEVICE}:{rank}"], r
    assert "mIoU" in out


def test_psanet(dataset, tmp_path):
    code, out, work = train_family(tmp_path, dataset, "psanet")
    assert code == 0, out[-5000:]
    assert "run on the card as ordinary tensor ops: PSAMask x2 as GCUPSAMask" in out, out[-5000:]
    assert_trained_on_own_cards(out, work)


def test_segformer(dataset, tmp_path):
    code, out, work = train_family(tmp_path, dataset, "segformer")
    assert code == 0, out[-5000:]
    assert_trained_on_own_cards(out, work)
