# UPerNet on a DINOv2 ViT-L/14 backbone (mmpretrain's VisionTransformer, arch 'large', 304M
# parameters) with a multi-level neck (MLN) on LoveDA, 518x518 crops, 80k iterations, on the
# 8 cards of a T20 server: the ViT-S/14 config beside this one (mmseg's ViT-UPerNet recipe,
# vit_vit-b16_mln_upernet_8xb2-80k_ade20k-512x512) with DINOv2's large backbone.
#
# Needs mmpretrain 1.2.0 (and torchvision), which tools/install_t20.sh installs into the T20
# environment. No torchvision build matches torch 2.13, so this config does not run there.
#
# Memory: check it fits a T20 card before a T20 slot is spent, on a workstation's CPU:
#   mmgcu rehearse upernet_dinov2-l14_8xgcu-80k_loveda-518x518.py --scale real
# One rank measures a card at the real crop, and the report adds what the other 7 ranks add
# to each card (DDP's gradient buckets, SyncBN's) for the per-card figure against 32 GiB
# (docs/rehearsal.md: "Check a large model's memory on a workstation").
#
# Data, crop (518 = 37 x 14 patches), slide validation, AdamW and its schedule, and the batch
# of 16 on 8 cards are the ViT-S/14 config's, which this one inherits; only the backbone and
# the widths of the neck and heads change.
#
# Pretrained backbone: a local file (a T20 host often has no network), mmpretrain's
# conversion of Meta's dinov2_vitl14 (keys 'backbone.*'). Get it once, where there is network:
#   mkdir -p pretrain && wget -P pretrain https://download.openmmlab.com/mmpretrain/v1.0/dinov2/vit-large-p14_dinov2-pre_3rdparty_20230426-f3302d9e.pth
# Another path: --cfg-options model.backbone.init_cfg.checkpoint=PATH (`pretrained` below
# is read when the config loads).
_base_ = ["./upernet_dinov2-s14_8xgcu-80k_loveda-518x518.py"]

pretrained = "pretrain/vit-large-p14_dinov2-pre_3rdparty_20230426-f3302d9e.pth"
embed_dims = 1024  # ViT-L
model = dict(
    backbone=dict(
        # mmpretrain's 'large' (1024 dims, 24 layers, 16 heads, MLP 4096) is DINOv2's ViT-L/14:
        # its headless config, vit-large-p14_dinov2-pre_headless.py, builds the checkpoint's
        # model from arch 'large', patch 14 and the ViT-S config's layer scale.
        arch="large",
        out_indices=(5, 11, 17, 23),  # every sixth of the 24 layers, as (2, 5, 8, 11) of 12
        drop_path_rate=0.2,  # mmseg's ViT-L (BEiT-L UPerNet) rate
        init_cfg=dict(checkpoint=pretrained),
    ),
    neck=dict(in_channels=[embed_dims] * 4, out_channels=embed_dims),
    decode_head=dict(in_channels=[embed_dims] * 4),
    auxiliary_head=dict(in_channels=embed_dims),
)
