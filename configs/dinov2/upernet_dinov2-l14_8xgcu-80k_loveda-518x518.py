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
# Crop 518 = 37 x 14: a whole number of patches, and the grid DINOv2 was pre-trained at, so
# the checkpoint's 37x37 position embedding loads as it is. A 512 crop would be padded to 518
# inside the patch embedding, and the logits of 518 pixels stretched back onto 512.
#
# Batch and lr: 8 cards x 2 images = 16 a step, the batch of mmseg's ViT recipe (8 GPUs x 2),
# so its AdamW lr 6e-5 holds. On fewer cards, add `--cfg-options auto_scale_lr.enable=True`.
#
# Pretrained backbone: a local file (a T20 host often has no network), mmpretrain's
# conversion of Meta's dinov2_vitl14 (keys 'backbone.*'). Get it once, where there is network:
#   mkdir -p pretrain && wget -P pretrain https://download.openmmlab.com/mmpretrain/v1.0/dinov2/vit-large-p14_dinov2-pre_3rdparty_20230426-f3302d9e.pth
# Another path: --cfg-options model.backbone.init_cfg.checkpoint=PATH (`pretrained` below
# is read when the config loads).
_base_ = [
    "mmseg::_base_/models/upernet_vit-b16_ln_mln.py",
    "../_base_/datasets/loveda_8xgcu.py",
    "mmseg::_base_/schedules/schedule_80k.py",
    # In place of mmseg's default_runtime, which it inherits (two sibling bases may not
    # define the same key): GCURunner, ECCL, GCU DDP.
    "../_base_/gcu_runtime.py",
]

# mmpretrain.models registers 'mmpretrain.VisionTransformer' (mmengine imports it when the
# config loads, on every rank).
custom_imports = dict(imports=["mmgcu", "mmpretrain.models"], allow_failed_imports=False)

pretrained = "pretrain/vit-large-p14_dinov2-pre_3rdparty_20230426-f3302d9e.pth"
crop_size = (518, 518)
embed_dims = 1024  # ViT-L
num_classes = 7  # LoveDADataset: background, building, road, water, barren, forest, agricultural
data_preprocessor = dict(size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    # EncoderDecoder would hand `pretrained` to the backbone, which mmpretrain's takes as
    # init_cfg instead.
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type="mmpretrain.VisionTransformer",
        # mmpretrain's 'large' (1024 dims, 24 layers, 16 heads, MLP 4096) is DINOv2's ViT-L/14:
        # its headless config, vit-large-p14_dinov2-pre_headless.py, builds the checkpoint's
        # model from arch 'large', patch 14 and the layer scale below.
        arch="large",
        img_size=crop_size[0],
        patch_size=14,
        layer_scale_init_value=1e-5,
        out_indices=(5, 11, 17, 23),  # every sixth of the 24 layers, as (2, 5, 8, 11) of 12
        out_type="featmap",  # patch tokens as (N, C, 37, 37) maps, no class token
        drop_path_rate=0.2,  # mmseg's ViT-L (BEiT-L UPerNet) rate
        init_cfg=dict(type="Pretrained", checkpoint=pretrained, prefix="backbone."),
    ),
    # Strides 3.5, 7, 14 and 28 from the one 14-stride map, as mmseg's ViT-UPerNet.
    neck=dict(in_channels=[embed_dims] * 4, out_channels=embed_dims, scales=[4, 2, 1, 0.5]),
    # The heads' norm_cfg stays SyncBN as in mmseg (the backbone uses LayerNorm): GCURunner
    # makes each layer a GCUSyncBatchNorm over the cards; a single-process run uses plain BN.
    decode_head=dict(in_channels=[embed_dims] * 4, num_classes=num_classes),
    auxiliary_head=dict(in_channels=embed_dims, num_classes=num_classes),
    # LoveDA's 1024x1024 val images in 518x518 windows (2/3 overlap): the grid trained on,
    # and one input shape for the card's compiled graph whatever the image size.
    test_cfg=dict(mode="slide", crop_size=crop_size, stride=(345, 345)),
)

# mmseg's LoveDA training pipeline with the 518 crop.
train_pipeline = [
    dict(type="LoadImageFromFile"),
    dict(type="LoadAnnotations", reduce_zero_label=True),
    dict(type="RandomResize", scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type="RandomCrop", crop_size=crop_size, cat_max_ratio=0.75),
    dict(type="RandomFlip", prob=0.5),
    dict(type="PhotoMetricDistortion"),
    dict(type="PackSegInputs"),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))

# AdamW, no weight decay for the position embedding, the class token, the layer norms
# (mmpretrain names them ln1, ln2) and the layer scales (gamma1, gamma2).
optim_wrapper = dict(
    _delete_=True,
    type="OptimWrapper",
    optimizer=dict(type="AdamW", lr=0.00006, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(
        custom_keys={
            "pos_embed": dict(decay_mult=0.0),
            "cls_token": dict(decay_mult=0.0),
            ".ln": dict(decay_mult=0.0),
            ".gamma": dict(decay_mult=0.0),
        }
    ),
)
# 1500 iterations of linear warm-up, then linear decay to 0.
param_scheduler = [
    dict(type="LinearLR", start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type="PolyLR", eta_min=0.0, power=1.0, begin=1500, end=80000, by_epoch=False),
]

# Per-card batch 2 (loveda_8xgcu.py) x 8 cards; the lr above is already set for 16.
auto_scale_lr = dict(enable=False, base_batch_size=16)
