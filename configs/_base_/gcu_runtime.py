# The one base an mmseg config inherits to train on GCU cards (Enflame T20 and newer):
# mmseg's default_runtime plus what GCUs need. Put it in `_base_` in place of default_runtime
# (mmengine refuses keys defined by two sibling bases). Works with the stock
# tools/train.py, `--launcher pytorch`, under torchrun or tools/dist_train.sh.
_base_ = ["mmseg::_base_/default_runtime.py"]

custom_imports = dict(imports=["mmgcu"], allow_failed_imports=False)
runner_type = "GCURunner"

env_cfg = dict(
    # 'auto': torch_gcu 2.x, then 1.x, then CUDA, then CPU. 'gcu' refuses to run without one.
    device="auto",
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method="fork", opencv_num_threads=0),
    # 'eccl' means the generation's backend: 'cpu:gloo,gcu:eccl' on torch_gcu 2.x,
    # a gloo default group plus an ECCL group for card tensors on 1.x.
    # timeout (seconds a collective may wait) is left to mmgcu: 1800, for the slow
    # first step and validation metrics; a hang in steady training is ended sooner by
    # the watchdog (env_cfg.watchdog, 300 s by default).
    dist_cfg=dict(backend="eccl"),
)

# DDP options. No type: GCURunner picks the generation's wrapper (GCUDistributedDataParallel
# on torch_gcu 2.x and CUDA, GCU1DistributedDataParallel around torch_gcu 1.x's own DDP).
model_wrapper_cfg = dict(
    # Buffers (BN statistics) are not re-broadcast each step: SyncBN or per-rank BN is the
    # model's choice, and a broadcast per forward costs a collective (mmengine's default too).
    broadcast_buffers=False,
    # mmseg models use every parameter in the loss; finding unused ones costs a graph walk.
    find_unused_parameters=False,
    # bucket_cap_mb is left to each generation's DDP: 25 in torch (2.x), 256 in
    # torch_gcu 1.x's. Larger buckets mean fewer, larger ECCL all-reduces; tune it on the
    # hardware (no ECCL figures are published).
    # torch's default (False). True saves one gradient-sized copy of memory per step, but
    # gradients then alias DDP's buckets: enable it after checking your hooks do not keep
    # or resize .grad. torch_gcu 1.x's DDP refuses True on a card.
    gradient_as_bucket_view=False,
    # static_graph=True (torch >= 1.11 only, so not set here: the T20's torch 1.10 DDP has
    # no such argument) skips per-step graph checks for models whose graph never changes.
)

# GCURunner also maps stock OptimWrapper/AmpOptimWrapper, ValLoop/TestLoop, LogProcessor
# and EmptyCacheHook to their GCU counterparts; naming them here keeps the config honest.
log_processor = dict(type="GCULogProcessor", by_epoch=False)

# Set False to drop the placement check (GCUDevicePlacementHook) that GCURunner adds.
gcu_placement_check = True
