# UPerNet with a ViT-B/16 backbone and a multi-level neck (MLN) on LoveDA, 512x512 crops,
# 80k iterations, on the 8 cards of a T20 server: mmseg's
# vit_vit-b16_mln_upernet_8xb2-80k_ade20k-512x512 recipe, on LoveDA, with the GCU runtime.
#
# Batch and lr: 8 cards x 2 images = 16 a step, the batch mmseg's ViT recipe was tuned for
# (8 GPUs x 2), so its AdamW lr 6e-5 holds unchanged. On fewer cards, add
# `--cfg-options auto_scale_lr.enable=True` to scale the lr linearly by (cards x 2) / 16.
#
# Pretrained backbone: a local file, so nothing is downloaded when training starts. It is
# timm's ImageNet-21k ViT-B/16 (fine-tuned on 1k) with its keys converted to mmseg's names
# by mmseg's converter, once:
#   python $(python -c "import mmseg,os;print(os.path.dirname(mmseg.__file__))")/.mim/tools/model_converters/vit2mmseg.py \
#       https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-vitjx/jx_vit_base_p16_224-80ecf9dd.pth \
#       pretrain/jx_vit_base_p16_224-80ecf9dd.pth
# (download the .pth first and give its path instead of the URL where the node is offline).
# The 224x224 position embedding is resized to the 512x512 grid when the weights load.
_base_ = [
    "mmseg::_base_/models/upernet_vit-b16_ln_mln.py",
    "../_base_/datasets/loveda_8xgcu.py",
    "mmseg::_base_/schedules/schedule_80k.py",
    # In place of mmseg's default_runtime, which it inherits (two sibling bases may not
    # define the same key): GCURunner, ECCL, GCU DDP.
    "../_base_/gcu_runtime.py",
]

crop_size = (512, 512)
num_classes = 7  # LoveDADataset: background, building, road, water, barren, forest, agricultural
data_preprocessor = dict(size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    pretrained="pretrain/jx_vit_base_p16_224-80ecf9dd.pth",
    backbone=dict(img_size=crop_size),
    # The heads' norm_cfg stays SyncBN as in mmseg (the backbone uses LayerNorm): GCURunner
    # makes each layer a GCUSyncBatchNorm over the cards; a single-process run uses plain BN.
    decode_head=dict(num_classes=num_classes),
    auxiliary_head=dict(num_classes=num_classes),
)

# AdamW, no weight decay for the position embedding, the class token and the norms.
optim_wrapper = dict(
    _delete_=True,
    type="OptimWrapper",
    optimizer=dict(type="AdamW", lr=0.00006, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(
        custom_keys={
            "pos_embed": dict(decay_mult=0.0),
            "cls_token": dict(decay_mult=0.0),
            "norm": dict(decay_mult=0.0),
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
