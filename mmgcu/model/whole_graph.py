"""Stock mmseg models kept to one graph a step and a few graph shapes on a lazy card.

A torch_gcu 1.x card is an XLA device: a read of a card value runs the pending graph, an op
whose output shape depends on the data (nonzero, boolean-mask indexing) cuts it, and every
graph not seen before compiles, for minutes on a vision model. Measured on a real XLA
runtime (torch_xla on the CPU, ``tests/conformance``), stock mmseg code does all three every
step: each decode head's ``acc_seg`` indexes with a mask (two cuts, and a new graph for
each new count of ignored pixels), ``CrossEntropyLoss(avg_non_ignore=True)`` reads a count
(``.item()``), and validation compiles a graph per image size, more with the metric's masks
and histograms on the card.

:func:`keep_graph_whole` changes, on the model ``GCUStrategy`` puts on a lazy card (never on
another device, never under another runner), what needs it:

- a decode head whose loss is mmseg's ``BaseDecodeHead.loss_by_feat``: ``acc_seg`` computed
  with static shapes (the same value, :func:`mmgcu.compat.mmseg.static_accuracy`);
- mmseg's ``CrossEntropyLoss`` with ``avg_non_ignore=True``: its divisor stays on the card;
- the segmentor's post-processing (the crop of the padding, the resize to each image's own
  size, the argmax) runs on the host: one transfer of the batch's logits;
- the data preprocessor runs on the host: a training crop smaller than the training size
  (a random resize below 1) is padded there, not by a pad of its own amounts on the card (a
  graph each), and each validation batch is padded to a shape bucket (:func:`bucket_side`):
  validation compiles one graph per bucket, not one per image size; the padding is cropped
  back before the resize to the original size.

Each change gives one module a subclass of its own class (as torch.nn.utils.parametrize
does), keeping its state; :func:`changes` lists them, and what could not be changed.
"""

from typing import Dict, List, Tuple

import torch
from torch import nn

#: The classes made for changed modules, by (change, original class).
_MADE: Dict[Tuple[type, type], type] = {}


def bucket_side(side: int, divisor: int = 1) -> int:
    """The least side of the ladder 32, 48, 64, 96, 128, 192, ... (32 and 48 times powers of
    two: at most half again of the side, a fifth on average) that holds ``side``, then a
    multiple of ``divisor``."""
    step = 32
    while True:
        for value in (step, step * 3 // 2):
            if value >= side:
                return -(-value // divisor) * divisor
        step *= 2


class LazyChange:
    """What a changed module's class adds; ``change`` says what, for logs and reports, and
    ``stock`` is the class it was made from."""

    change = ""
    stock: type = nn.Module


class StaticAccuracyHead(LazyChange):
    """A decode head whose ``acc_seg`` has static shapes."""

    change = "acc_seg without data-dependent shapes (no cut, no new graph per step)"

    def loss_by_feat(self, seg_logits, batch_data_samples) -> dict:
        from ..compat import mmseg

        return mmseg.loss_by_feat(self, seg_logits, batch_data_samples, mmseg.static_accuracy)


class DivisorOnCard(LazyChange):
    """mmseg's ``CrossEntropyLoss(avg_non_ignore=True)`` whose divisor (the count of pixels
    not ignored) stays a card tensor: mmseg reads it with ``.item()`` every step."""

    change = "avg_non_ignore's divisor kept on the card (no read per step)"

    def forward(
        self,
        cls_score,
        label,
        weight=None,
        avg_factor=None,
        reduction_override=None,
        ignore_index=-100,
        **kwargs,
    ):
        reduction = reduction_override if reduction_override else self.reduction
        if avg_factor is None and reduction == "mean":
            avg_factor = (label != ignore_index).sum()
        return super().forward(
            cls_score, label, weight, avg_factor, reduction_override, ignore_index, **kwargs
        )


class HostPostprocess(LazyChange):
    """A segmentor that crops, resizes and labels its predictions on the host."""

    change = "predictions post-processed on the host (one transfer of the logits per batch)"

    def postprocess_result(self, seg_logits, data_samples=None):
        logits = seg_logits.cpu()
        if logits.dtype in (torch.float16, torch.bfloat16):
            # AMP's half logits: torch 1.10's CPU has no half kernel for the resize, so the
            # host resizes them in float32
            logits = logits.float()
        return super().postprocess_result(logits, data_samples)


class HostBatches(LazyChange):
    """A data preprocessor that makes each batch on the host (normalised, padded, stacked)
    and moves it to the card at one shape: padded there, each crop smaller than the
    training size (a random resize below 1) pads by its own amounts, a graph of its own;
    in validation each batch is padded to a shape bucket."""

    change = (
        "batches normalised and padded on the host (validation: to shape buckets "
        "32, 48, 64, 96, ...), then moved to the card"
    )
    _host_stats = None

    def forward(self, data: dict, training: bool = False) -> dict:
        from ..compat import mmseg

        data = dict(data, inputs=[x.cpu() for x in data["inputs"]])
        size = None if training else self._test_size(data["inputs"])
        batch = mmseg.host_batch(self, data, training, size, self._host_stats)
        inputs = batch["inputs"].to(self.device)
        samples = batch["data_samples"]
        if training:  # the loss reads the labels on the card
            samples = [s.to(self.device) for s in samples]
            if self.batch_augments is not None:
                inputs, samples = self.batch_augments(inputs, samples)
        return dict(inputs=inputs, data_samples=samples)

    def _test_size(self, inputs):
        """The bucket of a test batch; None where the config fixed the size itself."""
        test_cfg = self.test_cfg or {}
        if test_cfg.get("size"):
            return None
        divisor = test_cfg.get("size_divisor") or 1
        return tuple(bucket_side(max(x.shape[d] for x in inputs), divisor) for d in (-2, -1))


def _give(module: nn.Module, change: type) -> None:
    """``module`` as an instance of a subclass of its class that adds ``change``."""
    cls = type(module)
    if issubclass(cls, change):
        return
    made = _MADE.get((change, cls))
    if made is None:
        made = type(f"GCU{cls.__name__}", (change, cls), {"__module__": __name__, "stock": cls})
        _MADE[(change, cls)] = made
    module.__class__ = made


def keep_graph_whole(model: nn.Module) -> List[str]:
    """Make the changes above where ``model`` needs them; return what was changed."""
    try:
        from mmseg.models.data_preprocessor import SegDataPreProcessor
        from mmseg.models.decode_heads.decode_head import BaseDecodeHead
        from mmseg.models.losses import CrossEntropyLoss
        from mmseg.models.segmentors.base import BaseSegmentor
    except ImportError:  # not an mmseg model
        return []
    for module in model.modules():
        cls = type(module)
        if isinstance(module, BaseDecodeHead) and cls.loss_by_feat is BaseDecodeHead.loss_by_feat:
            _give(module, StaticAccuracyHead)
        elif (
            cls is CrossEntropyLoss
            and module.avg_non_ignore
            and not (module.use_sigmoid or module.use_mask)
        ):
            _give(module, DivisorOnCard)
        elif (
            isinstance(module, BaseSegmentor)
            and cls.postprocess_result is BaseSegmentor.postprocess_result
        ):
            _give(module, HostPostprocess)
        elif cls is SegDataPreProcessor:
            from ..compat.mmseg import host_stats

            module._host_stats = host_stats(module)  # read now, while the model is on the host
            _give(module, HostBatches)
    return changes(model)["changed"]


def changes(model: nn.Module) -> Dict[str, List[str]]:
    """What :func:`keep_graph_whole` changed in ``model`` (``'changed'``: ``'FCNHead x2:
    what'``), and the decode heads whose own loss code keeps mmseg's accuracy, a cut and a
    new graph each step (``'kept'``: ``'EncHead x1'``)."""
    changed: Dict[Tuple[str, str], int] = {}
    kept: Dict[str, int] = {}
    for module in model.modules():
        if isinstance(module, LazyChange):
            key = (type(module).stock.__name__, module.change)
            changed[key] = changed.get(key, 0) + 1
        elif _own_loss(module):
            kept[type(module).__name__] = kept.get(type(module).__name__, 0) + 1
    return dict(
        changed=[f"{name} x{n}: {what}" for (name, what), n in changed.items()],
        kept=[f"{name} x{n}" for name, n in kept.items()],
    )


def _own_loss(module: nn.Module) -> bool:
    """Whether ``module`` is a decode head whose loss is its own code (not changed here)."""
    try:
        from mmseg.models.decode_heads.decode_head import BaseDecodeHead
    except ImportError:
        return False
    return (
        isinstance(module, BaseDecodeHead)
        and type(module).loss_by_feat is not BaseDecodeHead.loss_by_feat
    )
