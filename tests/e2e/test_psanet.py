"""PSANet (mmseg's PSAHead, whose PSAMask is an mmcv compiled op with no card kernel:
"psamask_forward_impl: implementation for device gcu:1 not found") trains on simulated cards
of this leg's generation with stock tools/train.py: GCURunner runs it as GCUPSAMask."""

import pytest

from tests.e2e.conftest import (
    LEG_DEVICE,
    finish,
    mmseg_tool,
    probes,
    torchrun,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.t20]

# The tiny FCN's backbone at output stride 8 (8x8 features of a 64x64 crop, 4x4 after
# PSANet's shrink) under mmseg's PSAHead, both directions of attention.
PSANET = dict(
    backbone=dict(strides=(1, 2, 1, 1), dilations=(1, 1, 2, 4)),
    decode_head=dict(
        _delete_=True,
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
        num_classes=4,
        norm_cfg=dict(type="SyncBN", requires_grad=True),
        align_corners=False,
        loss_decode=dict(type="CrossEntropyLoss", use_sigmoid=False, loss_weight=1.0),
    ),
)


def test_psanet_trains_on_two_cards(dataset, tmp_path):
    cfg = write_config(
        tmp_path / "psanet.py",
        dataset,
        model=PSANET,
        train_cfg=dict(type="IterBasedTrainLoop", max_iters=2, val_interval=2),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", by_epoch=False, interval=2)),
    )
    work = str(tmp_path / "work")
    args = [mmseg_tool("train.py"), cfg, "--launcher", "pytorch", "--work-dir", work]
    code, out = finish(torchrun(args, nproc=2, cards=2))
    assert code == 0, out[-5000:]
    assert "run on the card as ordinary tensor ops: PSAMask x2 as GCUPSAMask" in out, out[-5000:]
    reports = probes(work)
    assert sorted(reports) == [0, 1]
    for rank, r in reports.items():
        assert r["param_devices"] == [f"{LEG_DEVICE}:{rank}"], r
        assert r["loss_devices"] == [f"{LEG_DEVICE}:{rank}"], r
    assert "mIoU" in out
