"""The programs the conformance suite runs on both XLA cards (see ``backends.py``).

Each is a function of a backend that returns what the card did: per training step, or per
validation, the graphs it ran, the graphs it compiled and the ops that fell back to the CPU.
Their code is what mmseg 1.2.2 runs (its losses, metrics, models and data preprocessor),
on the device the backend gives; seeded, so both backends see the same shapes.
"""

import copy
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F
from torch import nn

from .backends import delta

IGNORE = 255
CLASSES = 4


def _labels(n: int, side: int, border: int) -> torch.Tensor:
    """Label maps whose ignored border is ``border`` rows deep (an ignored-pixel count
    that changes with it, as real masks' do)."""
    labels = torch.randint(0, CLASSES, (n, side, side))
    labels[:, :border] = IGNORE
    return labels


def _convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, CLASSES, 1),
    )


def _train_steps(be, steps: int, loss_fn: Callable, side: int = 16) -> List[Dict[str, object]]:
    """``steps`` steps of the conv net with one cut each (the step): each step's counts.
    ``loss_fn(logits, labels)`` returns the loss and the values the step logs."""
    torch.manual_seed(0)
    model = _convnet().to(be.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    out, kept = [], []
    for i in range(steps):
        images = torch.randn(2, 3, side, side).to(be.device)
        labels = _labels(2, side, border=1 + i).to(be.device)
        before = be.counts()
        optimizer.zero_grad(set_to_none=True)  # torch 2's default, also on 1.10
        loss, logged = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        kept = logged  # live at the step, as a logger's values are
        be.step()
        out.append(delta(be.counts(), before))
    del kept
    return out


def conv_step(be):
    """A conv net's train step: loss, backward, SGD, one cut at the step."""
    return _train_steps(be, 4, lambda x, y: (F.cross_entropy(x, y, ignore_index=IGNORE), []))


def with_accuracy(be):
    """The same with mmseg's ``accuracy()``, which every decode head logs as ``acc_seg``."""
    from mmseg.models.losses import accuracy

    def loss(x, y):
        return F.cross_entropy(x, y, ignore_index=IGNORE), [accuracy(x, y, ignore_index=IGNORE)]

    return _train_steps(be, 4, loss)


def with_avg_non_ignore(be):
    """mmseg's accuracy and ``CrossEntropyLoss(avg_non_ignore=True)`` (a read per step)."""
    from mmseg.models.losses import CrossEntropyLoss, accuracy

    criterion = CrossEntropyLoss(avg_non_ignore=True)

    def loss(x, y):
        return criterion(x, y, ignore_index=IGNORE), [accuracy(x, y, ignore_index=IGNORE)]

    return _train_steps(be, 4, loss)


def static_accuracy(be):
    """``acc_seg`` without data-dependent shapes: ``((pred == label) & valid).sum()``."""

    def loss(x, y):
        valid = y != IGNORE
        correct = ((x.argmax(1) == y) & valid).sum()
        acc = correct.float() * 100.0 / valid.sum().float().clamp(min=1)
        return F.cross_entropy(x, y, ignore_index=IGNORE), [acc]

    return _train_steps(be, 4, loss)


def amp_step(be):
    """The conv net's step under bfloat16 autocast on the card."""

    def loss(x, y):
        return F.cross_entropy(x.float(), y, ignore_index=IGNORE), []

    torch.manual_seed(0)
    model = _convnet().to(be.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    out = []
    for _ in range(3):
        images = torch.randn(2, 3, 16, 16).to(be.device)
        labels = _labels(2, 16, border=1).to(be.device)
        before = be.counts()
        optimizer.zero_grad(set_to_none=True)  # torch 2's default, also on 1.10
        with be.autocast(torch.bfloat16):
            value, _ = loss(model(images), labels)
        value.backward()
        optimizer.step()
        be.step()
        out.append(delta(be.counts(), before))
    return out


def collective_step(be):
    """A data-parallel step: each gradient summed over the world through torch.distributed
    (DDP's all-reduce, here on a world of one process) before the optimizer steps. On XLA
    a collective is an op of the graph, not a cut."""
    import torch.distributed as dist

    be.init_world()
    torch.manual_seed(0)
    model = _convnet().to(be.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    out = []
    for _ in range(4):
        images = torch.randn(2, 3, 16, 16).to(be.device)
        labels = _labels(2, 16, border=1).to(be.device)
        before = be.counts()
        optimizer.zero_grad(set_to_none=True)  # torch 2's default, also on 1.10
        F.cross_entropy(model(images), labels, ignore_index=IGNORE).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        be.step()
        out.append(delta(be.counts(), before))
    return out


def _dropout_steps(be, reseed: bool) -> List[Dict[str, object]]:
    """Train steps of a net with dropout whose graph is synced as torch_gcu 1.x's
    optimizer_step syncs it: the parameters, their state and the loss (unlazy), no step
    marker; with ``reseed``, a new seed after each (what mmgcu does)."""
    torch.manual_seed(0)
    model = nn.Sequential(_convnet(), nn.Dropout2d(0.1)).to(be.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    out = []
    for i in range(4):
        images = torch.randn(2, 3, 16, 16).to(be.device)
        labels = _labels(2, 16, border=1).to(be.device)
        before = be.counts()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels, ignore_index=IGNORE)
        loss.backward()
        optimizer.step()
        be.sync(list(model.parameters()) + list(model.buffers()) + [loss])
        if reseed:
            be.reseed(1000 + i)
        out.append(delta(be.counts(), before))
    return out


def dropout_synced_without_a_marker(be):
    """The seed of each step's dropout chains on the last step's (no marker restarts it):
    every step's graph is longer, and compiles anew."""
    return _dropout_steps(be, reseed=False)


def dropout_reseeded(be):
    """The same with a new seed after each step: the chain restarts, no compile after two."""
    return _dropout_steps(be, reseed=True)


def empty_index(be):
    """Masks that select nothing, on tensors of four sizes: torch_xla 2.9 makes the empty
    result a constant (full(shape, 0)), so the graph after it is the same for every size."""
    out = []
    for n in (4, 5, 6, 7):
        x = torch.randn(n, n).to(be.device)
        be.step()
        before = be.counts()
        y = x[x > 100]
        torch.histc(y.float(), bins=4, min=0, max=3).cpu()
        out.append(delta(be.counts(), before))
    return out


def composite_ops(be):
    """Ops torch_xla lowers whole that torch gives a composite kernel too: ``repeat`` (as
    mmdet's MaskFormer and Mask2Former repeat their queries and point coordinates, and
    mmseg's EMANet its bases), ``tile``, ``mv``; train steps whose graph none of them cuts."""
    torch.manual_seed(0)
    weight = torch.randn(4, 8).to(be.device).requires_grad_()
    vector = torch.randn(8).to(be.device)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    out = []
    for _ in range(3):
        x = torch.randn(2, 4, 8).to(be.device)
        be.step()
        before = be.counts()
        optimizer.zero_grad(set_to_none=True)
        queries = weight.unsqueeze(0).repeat(2, 1, 1) + x.tile(1, 1, 1)
        queries.flatten(0, 1).mv(vector).pow(2).mean().backward()
        optimizer.step()
        be.step()
        out.append(delta(be.counts(), before))
    return out


def vit_block(be):
    """A ViT encoder layer of mmseg (attention, MLP, layer norms): train steps."""
    from mmseg.models.backbones.vit import TransformerEncoderLayer

    torch.manual_seed(0)
    layer = TransformerEncoderLayer(embed_dims=32, num_heads=4, feedforward_channels=64).to(
        be.device
    )
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    out = []
    for _ in range(3):
        tokens = torch.randn(2, 17, 32).to(be.device)
        before = be.counts()
        optimizer.zero_grad(set_to_none=True)  # torch 2's default, also on 1.10
        layer(tokens).pow(2).mean().backward()
        optimizer.step()
        be.step()
        out.append(delta(be.counts(), before))
    return out


# ---------------------------------------------------------------------------- mmseg models
TINY = dict(
    type="EncoderDecoder",
    data_preprocessor=dict(
        type="SegDataPreProcessor",
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_val=0,
        seg_pad_val=IGNORE,
    ),
    backbone=dict(
        type="ResNetV1c",
        depth=18,
        base_channels=8,
        stem_channels=8,
        num_stages=4,
        out_indices=(0, 1, 2, 3),
        dilations=(1, 1, 1, 1),
        strides=(1, 2, 2, 2),
        norm_cfg=dict(type="BN", requires_grad=True),
        style="pytorch",
        contract_dilation=True,
    ),
    decode_head=dict(
        type="FCNHead",
        in_channels=64,
        in_index=3,
        channels=16,
        num_convs=1,
        concat_input=False,
        dropout_ratio=0.1,
        num_classes=CLASSES,
        norm_cfg=dict(type="BN", requires_grad=True),
        align_corners=False,
        loss_decode=dict(type="CrossEntropyLoss", use_sigmoid=False, loss_weight=1.0),
    ),
    train_cfg=dict(),
    test_cfg=dict(mode="whole"),
)


def _build(cfg: dict, device) -> nn.Module:
    from mmengine.config import ConfigDict
    from mmengine.model import revert_sync_batchnorm
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules

    register_all_modules(init_default_scope=True)
    torch.manual_seed(0)
    return revert_sync_batchnorm(MODELS.build(ConfigDict(copy.deepcopy(cfg)))).to(device)


def _sample(height: int, width: int, border: int = 2, seed: int = 0) -> dict:
    """One packed sample as mmseg's PackSegInputs gives it (uint8 CHW image, label map)."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (3, height, width), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, CLASSES, (1, height, width), generator=g)
    labels[:, :border] = IGNORE
    sample = SegDataSample()
    sample.gt_sem_seg = PixelData(data=labels)
    sample.set_metainfo(
        dict(img_shape=(height, width), ori_shape=(height, width), pad_shape=(height, width))
    )
    return dict(inputs=[image], data_samples=[sample])


def _batch(samples: List[dict]) -> dict:
    return dict(
        inputs=[s["inputs"][0] for s in samples],
        data_samples=[s["data_samples"][0] for s in samples],
    )


def _train_model(be, cfg: dict, steps: int, side: int) -> List[Dict[str, object]]:
    from mmengine.optim import OptimWrapper

    cfg = dict(cfg, data_preprocessor=dict(cfg["data_preprocessor"], size=(side, side)))
    model = _build(cfg, be.device)
    model.train()
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.01))
    out = []
    for i in range(steps):
        batch = _batch([_sample(side, side, border=1 + i, seed=2 * i + k) for k in range(2)])
        before = be.counts()
        log_vars = model.train_step(batch, wrapper)
        be.step()
        out.append(delta(be.counts(), before))
        del log_vars
    return out


def tiny_train(be):
    """mmseg's EncoderDecoder (ResNetV1c-18 at an eighth of its width, FCN head), its own
    ``train_step`` with one cut a step."""
    return _train_model(be, TINY, steps=3, side=32)


#: Validation images: 20 of 11 sizes, as a keep-ratio resize gives ADE20K's (the short side
#: fixed, the long one following each image's aspect ratio).
SIZES = [(32, 32 + 8 * k) for k in range(6)] + [(32 + 8 * k, 32) for k in range(1, 6)]
VAL_SIZES = [SIZES[i % len(SIZES)] for i in range(20)]


def predict_one_class(model: nn.Module) -> None:
    """Every pixel predicted as class 0, whatever the backend's rounding: the data-dependent
    shapes of the metric (how many pixels agree with the label) are then the labels' alone,
    the same on both backends (near-uniform logits of a random model could tip either way)."""
    head = model.decode_head.conv_seg
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.arange(head.bias.numel(), 0, -1, dtype=head.bias.dtype))


def _validate(be, cfg: dict, sizes, on_card_metric: bool) -> Dict[str, object]:
    """``val_step`` per image, then mmseg's IoUMetric through mmengine's Evaluator (as
    ValLoop runs them): on the card tensors the model returns, or on the prediction moved
    to the host first."""
    from mmengine.evaluator import Evaluator
    from mmseg.evaluation import IoUMetric

    model = _build(cfg, be.device)
    model.eval()
    predict_one_class(model)
    evaluator = Evaluator(IoUMetric(iou_metrics=["mIoU"]))
    evaluator.dataset_meta = dict(classes=[str(c) for c in range(CLASSES)])
    before = be.counts()
    for i, (h, w) in enumerate(sizes):
        batch = _batch([_sample(h, w, seed=100 + i)])
        with torch.no_grad():
            outputs = model.val_step(batch)
        if not on_card_metric:
            outputs = [o.cpu() for o in outputs]
            batch["data_samples"] = [s.cpu() for s in batch["data_samples"]]
        evaluator.process(outputs, batch)
    evaluator.evaluate(len(sizes))
    return delta(be.counts(), before)


def val_host(be):
    """Validation of 20 images of 11 sizes, each prediction moved to the host."""
    return _validate(be, TINY, VAL_SIZES, on_card_metric=False)


def val_iou_on_card(be):
    """The same with IoUMetric on the card tensors (masked indexing, histc, reads)."""
    return _validate(be, TINY, VAL_SIZES, on_card_metric=True)


def val_iou_on_card_one_size(be):
    """IoUMetric on the card, 20 images of one size."""
    return _validate(be, TINY, [(32, 48)] * 20, on_card_metric=True)


def slide_inference(be):
    """Sliding-window inference (mmseg's ``slide_inference``) on images of two sizes."""
    cfg = dict(TINY, test_cfg=dict(mode="slide", crop_size=(32, 32), stride=(24, 24)))
    return _validate(be, cfg, [(48, 64), (48, 64), (56, 40)], on_card_metric=False)


def _fcn_r50() -> dict:
    """Stock FCN-R50 of mmseg (decode and auxiliary heads), at 64 px crops."""
    import os.path as osp

    import mmseg
    from mmengine.config import Config

    path = osp.join(
        osp.dirname(mmseg.__file__),
        ".mim/configs/fcn/fcn_r50-d8_4xb4-80k_ade20k-512x512.py",
    )
    cfg = Config.fromfile(path).model.to_dict()
    cfg["pretrained"] = None
    return cfg


def fcn_r50_train(be):
    """Stock FCN-R50, ``model.train_step`` with one cut a step."""
    return _train_model(be, _fcn_r50(), steps=3, side=64)


def fcn_r50_val_on_card(be):
    """Its validation, 8 images of 4 sizes, IoUMetric on the card."""
    sizes = [(64, 64), (64, 80), (80, 64), (64, 96)] * 2
    return _validate(be, _fcn_r50(), sizes, on_card_metric=True)


def fcn_r50_val_host(be):
    """The same with the prediction moved to the host first."""
    sizes = [(64, 64), (64, 80), (80, 64), (64, 96)] * 2
    return _validate(be, _fcn_r50(), sizes, on_card_metric=False)


def mmgcu_loops(be):
    """mmgcu's own runner (GCURunner, its optimizer wrapper, message hub, hooks and loops,
    its changes to the model) training mmseg's tiny FCN four iterations (label maps whose
    ignored border changes) and validating twelve images of twelve sizes: the graphs of
    each iteration and of the validation. On the oracle, mmgcu drives torch_xla through
    torch_gcu 1.x's API (``torch_gcu_on_xla.py``)."""
    import os.path as osp
    import tempfile

    from mmengine.config import Config
    from mmengine.hooks import Hook

    be.torch_gcu_api()
    from mmgcu import GCURunner
    from mmgcu.rehearsal.data import ASPECTS, write_dataset

    class Count(Hook):
        priority = "LOWEST"

        def __init__(self):
            self.steps, self.val = [], None

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            self.mark = be.counts()

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            self.steps.append(delta(be.counts(), self.mark))

        def before_val_epoch(self, runner):
            self.mark = be.counts()

        def after_val_epoch(self, runner, metrics=None):
            self.val = delta(be.counts(), self.mark)

    # the data and the work dir go with the run: a run leaves nothing in the temp folder
    with tempfile.TemporaryDirectory(prefix="mmgcu-conformance-") as root:
        cfg = Config.fromfile(osp.join(osp.dirname(__file__), "..", "..", TINY_CONFIG))
        dataset = dict(cfg.train_dataloader.dataset, data_root=root)
        model = dict(decode_head=dict(num_classes=4, ignore_index=IGNORE))
        write_dataset(root, dataset, "train", [(64, 64)] * 8, model)
        sizes = [(48, round(48 * a)) if a >= 1 else (round(48 / a), 48) for a in ASPECTS]
        write_dataset(root, dataset, "val", sizes, model, seed=1)
        for loader in ("train_dataloader", "val_dataloader"):
            split = "train" if loader.startswith("train") else "val"
            cfg[loader].dataset.update(
                data_root=root,
                data_prefix=dict(img_path=f"img_dir/{split}", seg_map_path=f"ann_dir/{split}"),
                ann_file=f"{split}.txt",
            )
            cfg[loader].update(num_workers=0, persistent_workers=False)
        cfg.train_cfg = dict(type="IterBasedTrainLoop", max_iters=4, val_interval=4)
        cfg.default_hooks.logger.interval = 1
        cfg.default_hooks.checkpoint = dict(type="CheckpointHook", interval=100)
        cfg.work_dir = osp.join(root, "work")
        cfg.launcher = "none"
        runner = GCURunner.from_cfg(cfg)
        count = Count()
        runner.register_hook(count)
        runner.train()
        return dict(steps=count.steps, val=count.val)


TINY_CONFIG = "configs/tiny/fcn_r18-tiny_8xgcu_synthetic-64x64.py"


PROGRAMS = {
    f.__name__: f
    for f in (
        conv_step,
        with_accuracy,
        with_avg_non_ignore,
        static_accuracy,
        amp_step,
        collective_step,
        dropout_synced_without_a_marker,
        dropout_reseeded,
        empty_index,
        composite_ops,
        vit_block,
        tiny_train,
        val_host,
        val_iou_on_card,
        val_iou_on_card_one_size,
        slide_inference,
        fcn_r50_train,
        fcn_r50_val_on_card,
        fcn_r50_val_host,
        mmgcu_loops,
    )
}
