# DeepLabV3+ with a ResNet-50-D8 (V1c) backbone on LoveDA, 512x512 crops, 80k iterations,
# on the 8 cards of a T20 server: mmseg's deeplabv3plus_r50-d8_4xb4-80k_loveda-512x512
# (LoveDA mIoU 50.99) with the GCU runtime.
#
# Batch and lr: 8 cards x 2 images = 16 a step, the total batch of mmseg's reference run
# (4 GPUs x 4), so its SGD lr 0.01 (schedule_80k) holds unchanged. On fewer cards, add
# `--cfg-options auto_scale_lr.enable=True` to scale the lr linearly by (cards x 2) / 16.
#
# Pretrained backbone: a local file, so nothing is downloaded when training starts (mmseg's
# 'open-mmlab://resnet50_v1c' would fetch it then). Get it once, no conversion needed:
#   mkdir -p pretrain && wget -P pretrain https://download.openmmlab.com/pretrain/third_party/resnet50_v1c-2cccc1ad.pth
_base_ = [
    "mmseg::_base_/models/deeplabv3plus_r50-d8.py",
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
    pretrained="pretrain/resnet50_v1c-2cccc1ad.pth",
    # norm_cfg stays SyncBN as in mmseg: GCURunner makes each layer a GCUSyncBatchNorm that
    # synchronises over the cards (either generation); a single-process run uses plain BN.
    decode_head=dict(num_classes=num_classes),
    auxiliary_head=dict(num_classes=num_classes),
)

# Per-card batch 2 (loveda_8xgcu.py) x 8 cards; the lr above is already set for 16.
auto_scale_lr = dict(enable=False, base_batch_size=16)
