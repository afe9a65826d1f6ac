# The tiny model, data and schedule (hooks included, as in mmseg's schedules) of the
# end-to-end tests and `make demo`, without a runtime: a real mmseg EncoderDecoder
# (ResNetV1c-18 at quarter width + FCN head) on the synthetic dataset of
# tools/make_synthetic_dataset.py, 2 images per card. A config puts it in _base_ next to a
# runtime base: mmgcu's gcu_runtime.py, or mmseg's default_runtime.py with mmgcu's two keys
# (tests/cli/test_walkthrough.py).
data_root = "data/synthetic"
crop_size = (64, 64)
num_classes = 4
metainfo = dict(
    classes=("background", "red", "green", "blue"),
    palette=[[20, 20, 20], [200, 40, 40], [40, 200, 40], [40, 40, 200]],
)

norm_cfg = dict(type="SyncBN", requires_grad=True)
data_preprocessor = dict(
    type="SegDataPreProcessor",
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255,
    size=crop_size,
)
model = dict(
    type="EncoderDecoder",
    data_preprocessor=data_preprocessor,
    pretrained=None,
    backbone=dict(
        type="ResNetV1c",
        depth=18,
        base_channels=16,
        stem_channels=16,
        num_stages=4,
        out_indices=(0, 1, 2, 3),
        dilations=(1, 1, 1, 1),
        strides=(1, 2, 2, 2),
        norm_cfg=norm_cfg,
        norm_eval=False,
        style="pytorch",
        contract_dilation=True,
    ),
    decode_head=dict(
        type="FCNHead",
        in_channels=128,
        in_index=3,
        channels=32,
        num_convs=1,
        concat_input=False,
        dropout_ratio=0.1,
        num_classes=num_classes,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type="CrossEntropyLoss", use_sigmoid=False, loss_weight=1.0),
    ),
    train_cfg=dict(),
    test_cfg=dict(mode="whole"),
)

train_pipeline = [
    dict(type="LoadImageFromFile"),
    dict(type="LoadAnnotations"),
    dict(type="RandomFlip", prob=0.5),
    dict(type="PackSegInputs"),
]
test_pipeline = [
    dict(type="LoadImageFromFile"),
    dict(type="LoadAnnotations"),
    dict(type="PackSegInputs"),
]
dataset = dict(
    type="BaseSegDataset",
    data_root=data_root,
    metainfo=metainfo,
    img_suffix=".png",
    seg_map_suffix=".png",
    reduce_zero_label=False,
    # 64 + 16 images, no loader workers: nothing to share by serializing the annotation
    # list, which costs a full gc.collect() per dataset (~0.2 s once torch is imported).
    serialize_data=False,
)
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type="InfiniteSampler", shuffle=True),
    dataset=dict(
        **dataset,
        data_prefix=dict(img_path="img_dir/train", seg_map_path="ann_dir/train"),
        pipeline=train_pipeline,
    ),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type="DefaultSampler", shuffle=False),
    dataset=dict(
        **dataset,
        data_prefix=dict(img_path="img_dir/val", seg_map_path="ann_dir/val"),
        pipeline=test_pipeline,
    ),
)
test_dataloader = val_dataloader
val_evaluator = dict(type="IoUMetric", iou_metrics=["mIoU"])
test_evaluator = val_evaluator

optim_wrapper = dict(
    type="OptimWrapper",
    optimizer=dict(type="SGD", lr=0.01, momentum=0.9, weight_decay=0.0005),
    clip_grad=None,
)
param_scheduler = [dict(type="PolyLR", eta_min=1e-4, power=0.9, begin=0, end=4, by_epoch=False)]
train_cfg = dict(type="IterBasedTrainLoop", max_iters=4, val_interval=4)
val_cfg = dict(type="ValLoop")
test_cfg = dict(type="TestLoop")
default_hooks = dict(
    timer=dict(type="IterTimerHook"),
    logger=dict(type="LoggerHook", interval=1, log_metric_by_epoch=False),
    param_scheduler=dict(type="ParamSchedulerHook"),
    checkpoint=dict(type="CheckpointHook", by_epoch=False, interval=4),
    sampler_seed=dict(type="DistSamplerSeedHook"),
    visualization=dict(type="SegVisualizationHook"),
)
