# The config of `make demo`: the tiny FCN of fcn_r18-tiny_8xgcu_synthetic-64x64.py set up
# to learn the synthetic dataset in 40 iterations (about a minute on 8 simulated cards of
# a 2-core machine): validation mIoU rises from the ~17 of predicting background everywhere
# to ~85. 8 cards x 4 images = 32 images a step; SyncBN over the 8 cards, as in mmseg.
_base_ = ["./fcn_r18-tiny_8xgcu_synthetic-64x64.py"]

model = dict(
    # Output stride 8, as mmseg's d8 models: the base's stride 32 leaves 2x2 logits for a
    # 64x64 image, too coarse for its rectangles.
    backbone=dict(strides=(1, 2, 1, 1), dilations=(1, 1, 2, 4)),
    # avg_non_ignore: the loss mmseg recommends (and no warning per rank about it).
    decode_head=dict(dropout_ratio=0.0, loss_decode=dict(avg_non_ignore=True)),
)
train_dataloader = dict(batch_size=4)
# From scratch in 40 steps: AdamW converges where the base's SGD would need hundreds.
optim_wrapper = dict(optimizer=dict(_delete_=True, type="AdamW", lr=0.01, weight_decay=0.01))
param_scheduler = [dict(type="PolyLR", eta_min=1e-4, power=0.9, begin=0, end=40, by_epoch=False)]
train_cfg = dict(type="IterBasedTrainLoop", max_iters=40, val_interval=5)
# The base's hooks without SegVisualizationHook: it draws nothing here (draw=False) and says
# so once per rank (mmengine takes None only for its own default hooks, hence _delete_).
# tools/plot_demo.py draws the predictions.
default_hooks = dict(
    _delete_=True,
    timer=dict(type="IterTimerHook"),
    logger=dict(type="LoggerHook", interval=2, log_metric_by_epoch=False),
    param_scheduler=dict(type="ParamSchedulerHook"),
    checkpoint=dict(type="CheckpointHook", by_epoch=False, interval=40),
    sampler_seed=dict(type="DistSamplerSeedHook"),
)
