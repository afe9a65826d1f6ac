"""The rehearsal's config: offline data, local weights only, a short schedule, small crops."""

from mmengine.config import Config

from mmgcu.rehearsal.plan import DEFAULT_ITERS, SMALL_SIDE, derive, ranks, resume_derive

PIPELINE = [
    dict(type="LoadImageFromFile"),
    dict(type="LoadAnnotations"),
    dict(type="RandomResize", scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type="RandomCrop", crop_size=(512, 512), cat_max_ratio=0.75),
    dict(type="PackSegInputs"),
]


def stock_like(**model):
    """A config shaped like mmseg's: 512 crops, a URL for weights, a wrapped dataset."""
    dataset = dict(type="ADE20KDataset", data_root="data/ade", data_prefix={}, pipeline=PIPELINE)
    return Config(
        dict(
            model=dict(
                type="EncoderDecoder",
                pretrained="open-mmlab://resnet50_v1c",
                data_preprocessor=dict(type="SegDataPreProcessor", size=(512, 512)),
                backbone=dict(type="ResNetV1c", **model),
                test_cfg=dict(mode="slide", crop_size=(512, 512), stride=(341, 341)),
            ),
            train_dataloader=dict(
                batch_size=4,
                num_workers=4,
                dataset=dict(type="RepeatDataset", times=10, dataset=dataset),
            ),
            val_dataloader=dict(batch_size=1, dataset=dict(dataset, pipeline=PIPELINE[:2])),
            train_cfg=dict(type="IterBasedTrainLoop", max_iters=80000, val_interval=8000),
            default_hooks=dict(
                checkpoint=dict(type="CheckpointHook", interval=8000, out_dir="s3://team/ckpt")
            ),
            custom_imports=dict(imports=["mmgcu"]),
        )
    )


def test_small_scale_shrinks_every_input_size_and_no_layer():
    out, changes = derive(stock_like(depth=50), "/syn", iters=2, scale="small")
    factor = SMALL_SIDE / 512
    assert changes["crop"] == (SMALL_SIDE, SMALL_SIDE)
    assert out["model"]["data_preprocessor"]["size"] == (SMALL_SIDE, SMALL_SIDE)
    assert out["model"]["test_cfg"]["crop_size"] == (SMALL_SIDE, SMALL_SIDE)
    assert out["model"]["test_cfg"]["stride"] == (round(341 * factor),) * 2
    steps = {s["type"]: s for s in out["train_dataloader"]["dataset"]["dataset"]["pipeline"]}
    assert steps["RandomResize"]["scale"] == (512, 128)
    assert steps["RandomResize"]["ratio_range"] == (0.5, 2.0)
    assert steps["RandomCrop"]["crop_size"] == (SMALL_SIDE, SMALL_SIDE)
    assert out["model"]["backbone"] == dict(type="ResNetV1c", depth=50)
    assert changes["image_side"] == 128  # the resize scale's short side, shrunk


def test_position_tables_shrink_with_the_crop():
    """BEiT builds its tables for img_size: left at 512, a 128 crop would not fit them."""
    beit = stock_like()
    beit.model.backbone = dict(type="BEiT", img_size=(512, 512), patch_size=16)
    out, changes = derive(beit, "/syn", iters=2, scale="small")
    assert changes["crop"] == (SMALL_SIDE, SMALL_SIDE)
    assert out["model"]["backbone"] == dict(
        type="BEiT", img_size=(SMALL_SIDE, SMALL_SIDE), patch_size=16
    )
    (note,) = [n for n in changes["notes"] if "img_size" in n]
    assert note == (
        "scale small: BEiT's img_size (512, 512) -> (128, 128) with the crop "
        "(BEiT's relative position tables are built for it)"
    )
    out, changes = derive(beit, "/syn", iters=2, scale="real")
    assert out["model"]["backbone"]["img_size"] == (512, 512)
    assert not [n for n in changes["notes"] if "img_size" in n]


def test_real_scale_keeps_the_crop():
    out, changes = derive(stock_like(depth=50), "/syn", iters=2, scale="real")
    assert changes["crop"] == (512, 512) and changes["image_side"] == 512


def test_a_fixed_pooling_window_shrinks_the_crop_only_as_far_as_it_fits():
    """LRASPP's 49 x 49 window on stride-8 features fails below 392 px a side."""
    lraspp = stock_like()
    lraspp.model.decode_head = dict(type="LRASPPHead")
    lraspp.model.data_preprocessor.size = (512, 1024)  # Cityscapes' crop
    pipeline = [dict(step) for step in PIPELINE]
    pipeline[3]["crop_size"] = (512, 1024)
    lraspp.train_dataloader.dataset.dataset.pipeline = pipeline
    out, changes = derive(lraspp, "/syn", iters=2, scale="small")
    assert changes["crop"] == (392, 392)  # the least on both axes, not 392 x 784
    assert out["model"]["data_preprocessor"]["size"] == (392, 392)
    steps = {s["type"]: s for s in out["train_dataloader"]["dataset"]["dataset"]["pipeline"]}
    assert steps["RandomCrop"]["crop_size"] == (392, 392)
    # resize scales keep the factor that gives the crop's shorter side 392 px
    assert steps["RandomResize"]["scale"] == (1568, 392)
    assert out["model"]["test_cfg"]["crop_size"] == (392, 392)
    assert changes["notes"][0] == (
        "scale small: the crop stops at 392 px a side: LRASPP's 49 x 49 pooling window "
        "on stride-8 features needs 392 px a side"
    )
    lraspp.model.data_preprocessor.size = (256, 256)  # already below it: kept
    out, changes = derive(lraspp, "/syn", iters=2, scale="small")
    assert changes["crop"] == (256, 256)
    assert changes["notes"][0].startswith("scale small: the crop is kept: LRASPP's")


def test_weights_are_kept_only_when_they_are_a_local_file(tmp_path):
    local = tmp_path / "r50.pth"
    local.write_bytes(b"weights")
    cfg = stock_like(init_cfg=dict(type="Pretrained", checkpoint=str(local)))
    cfg.load_from = "checkpoints/not-here.pth"
    out, changes = derive(cfg, "/syn", iters=2, scale="small")
    assert out["model"]["pretrained"] is None
    assert out["model"]["backbone"]["init_cfg"]["checkpoint"] == str(local)
    assert out["load_from"] is None
    (note,) = [n for n in changes["notes"] if "random initialisation" in n]
    assert "open-mmlab://resnet50_v1c" in note and "not-here.pth" in note
    assert str(local) not in note


def test_data_schedule_and_hook():
    out, _ = derive(stock_like(depth=50), "/syn", iters=3, scale="small")
    train = out["train_dataloader"]
    assert train["dataset"]["type"] == "RepeatDataset" and train["dataset"]["times"] == 1
    inner = train["dataset"]["dataset"]
    assert inner["type"] == "ADE20KDataset" and inner["data_root"] == "/syn"
    assert inner["ann_file"] == "train.txt"
    assert inner["data_prefix"]["img_path"] == "img_dir/train"
    assert train["num_workers"] == 0 and train["batch_size"] == 4
    assert out["val_dataloader"]["dataset"]["ann_file"] == "val.txt"
    assert out["train_cfg"] == dict(type="IterBasedTrainLoop", max_iters=3, val_interval=3)
    assert out["default_hooks"]["checkpoint"]["interval"] == 3
    assert "out_dir" not in out["default_hooks"]["checkpoint"]
    assert out["default_hooks"]["logger"]["interval"] == 1
    hooks = [dict(type="RehearsalHook"), dict(type="RehearsalMemoryHook")]
    assert out["custom_hooks"][-2:] == hooks
    assert out["custom_imports"]["imports"] == [
        "mmgcu",
        "mmgcu.rehearsal.hook",
        "mmgcu.rehearsal.memory",
    ]


def test_real_scale_runs_one_rank_and_one_iteration_by_default():
    assert ranks("small", 8) == 8 and ranks("real", 8) == 1
    assert DEFAULT_ITERS == dict(small=3, real=1)


def test_the_real_scale_resume_trains_at_the_small_crop_with_the_same_model():
    cfg = stock_like(depth=50)
    out, note = resume_derive(cfg, "/syn", iters=1)
    assert out["model"]["data_preprocessor"]["size"] == (SMALL_SIDE, SMALL_SIDE)
    crop = out["train_dataloader"]["dataset"]["dataset"]["pipeline"][3]["crop_size"]
    assert crop == (SMALL_SIDE, SMALL_SIDE)
    assert out["model"]["backbone"] == dict(type="ResNetV1c", depth=50)
    assert out["train_cfg"]["max_iters"] == 1
    assert note.startswith(f"resume: one iteration at the small scale's crop {SMALL_SIDE}x")
    # a backbone whose tables are built for its img_size keeps the config's crop: the
    # checkpoint of the real scale fixes the tables' size
    beit = stock_like()
    beit.model.backbone = dict(type="BEiT", img_size=(512, 512))
    out, note = resume_derive(beit, "/syn", iters=1)
    assert out is None and "BEiT's relative position tables" in note
