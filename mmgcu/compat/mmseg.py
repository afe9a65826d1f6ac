"""mmseg 1.2.2's code that mmgcu mirrors, in one place.

On a lazy card (torch_gcu 1.x) mmgcu runs two pieces of mmseg's code in a form that keeps the
card's graph whole (:mod:`mmgcu.model.whole_graph`): a decode head's loss with an accuracy of
static shapes, and the data preprocessor on the host. Each is a copy of
mmseg's with the one change named, and :data:`UPSTREAM` records a digest of the upstream
source it mirrors or relies on, so that ``tests/compat/test_mmseg.py`` fails on an mmseg
whose source differs and names what to re-read. mmseg is imported only when a lazy card's
model needs these (mmgcu serves any OpenMMLab model).
"""

import hashlib
from typing import Callable

import torch
from torch import nn

from .mmengine import upstream_source

#: The mmseg release the pieces below mirror.
MMSEG_VERSION = "1.2.2"

#: sha256 of ``inspect.getsource`` of each upstream object a piece below relies on.
UPSTREAM = {
    # loss_by_feat mirrors it; static_accuracy gives accuracy()'s value (top-1, no thresh).
    "mmseg.models.decode_heads.decode_head.BaseDecodeHead.loss_by_feat": (
        "10863a800c501fa15f599114a6650c9c67f469210d8675acdb9aaef29500582d"
    ),
    "mmseg.models.losses.accuracy.accuracy": (
        "69869be4dc26e20d52b260bca35cb0801e523ab8e0d6afe5ef07c404dbe54c89"
    ),
    # the divisor of avg_non_ignore given as a tensor skips its .item()
    "mmseg.models.losses.cross_entropy_loss.cross_entropy": (
        "aff1ff9308556ecbc91600619805c467aa4482455b03f80f982a86d09f9f4bf0"
    ),
    "mmseg.models.losses.cross_entropy_loss.CrossEntropyLoss.forward": (
        "8b4a93d8ebfbdb7f48687d3e58ecbc37c64b9de68f78c7463e021314867548c8"
    ),
    # host_batch mirrors it
    "mmseg.models.data_preprocessor.SegDataPreProcessor.forward": (
        "79504d5626a4cf7e184d8d20385ddce595dd86052d3ddb30744a373bfd313e20"
    ),
    # crops the padding and resizes to the original shape on the device of its input
    "mmseg.models.segmentors.base.BaseSegmentor.postprocess_result": (
        "cf8f6e27eab74d4b3ad1347f9e8d50da7c252ce177f803fa142c8969c460fdb7"
    ),
}


def upstream_digest(qualified: str) -> str:
    return hashlib.sha256(upstream_source(qualified).encode()).hexdigest()


def changed_upstream() -> dict:
    """``{name: its digest here}`` of each :data:`UPSTREAM` object whose source differs
    from the one mmgcu mirrors (empty on mmseg 1.2.2)."""
    now = {name: upstream_digest(name) for name in UPSTREAM}
    return {name: digest for name, digest in now.items() if digest != UPSTREAM[name]}


def static_accuracy(pred: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """mmseg's ``accuracy(pred, target, ignore_index=...)`` (top-1, no threshold) without a
    tensor whose shape depends on the data: mmseg indexes with ``target != ignore_index``,
    a nonzero that cuts an XLA card's graph and gives the next graph a new shape each step.
    The same value: ``100 * correct / valid`` with mmseg's eps on both, shape ``(1,)``."""
    eps = torch.finfo(torch.float32).eps
    if pred.size(0) == 0:
        return pred.new_tensor(0.0)
    pred_label = pred.topk(1, dim=1)[1][:, 0]
    valid = target != ignore_index
    correct = ((pred_label == target) & valid).sum(dtype=torch.float32).reshape(1) + eps
    return correct * (100.0 / (valid.sum(dtype=torch.float32) + eps))


def loss_by_feat(head, seg_logits: torch.Tensor, batch_data_samples, accuracy: Callable) -> dict:
    """``BaseDecodeHead.loss_by_feat`` of mmseg 1.2.2 with ``accuracy`` in place of mmseg's
    (the one change)."""
    from mmseg.models.utils import resize

    seg_label = head._stack_batch_gt(batch_data_samples)
    loss = dict()
    seg_logits = resize(
        input=seg_logits,
        size=seg_label.shape[2:],
        mode="bilinear",
        align_corners=head.align_corners,
    )
    if head.sampler is not None:
        seg_weight = head.sampler.sample(seg_logits, seg_label)
    else:
        seg_weight = None
    seg_label = seg_label.squeeze(1)

    if not isinstance(head.loss_decode, nn.ModuleList):
        losses_decode = [head.loss_decode]
    else:
        losses_decode = head.loss_decode
    for loss_decode in losses_decode:
        value = loss_decode(
            seg_logits, seg_label, weight=seg_weight, ignore_index=head.ignore_index
        )
        if loss_decode.loss_name not in loss:
            loss[loss_decode.loss_name] = value
        else:
            loss[loss_decode.loss_name] += value

    loss["acc_seg"] = accuracy(seg_logits, seg_label, ignore_index=head.ignore_index)
    return loss


def host_stats(preprocessor):
    """The preprocessor's mean and std on the host, or None where it does not normalise."""
    if not preprocessor._enable_normalize:
        return None
    return preprocessor.mean.cpu(), preprocessor.std.cpu()


def host_batch(preprocessor, data: dict, training: bool, test_size, stats) -> dict:
    """``SegDataPreProcessor.forward`` of mmseg 1.2.2 computed on the host, up to its batch
    augments (the caller moves the batch to the card and runs those there). The changes:
    the CPU computes it (``stats``: :func:`host_stats`), and a test batch is padded to
    ``test_size`` (None: as mmseg does: the test_cfg's padding, else none)."""
    from mmseg.utils import stack_batch

    inputs = data["inputs"]
    data_samples = data.get("data_samples", None)
    if preprocessor.channel_conversion and inputs[0].size(0) == 3:
        inputs = [_input[[2, 1, 0], ...] for _input in inputs]

    inputs = [_input.float() for _input in inputs]
    if stats is not None:
        inputs = [(_input - stats[0]) / stats[1] for _input in inputs]

    if training:
        assert data_samples is not None, ("During training, ", "`data_samples` must be define.")
        inputs, data_samples = stack_batch(
            inputs=inputs,
            data_samples=data_samples,
            size=preprocessor.size,
            size_divisor=preprocessor.size_divisor,
            pad_val=preprocessor.pad_val,
            seg_pad_val=preprocessor.seg_pad_val,
        )
    else:
        img_size = inputs[0].shape[1:]
        assert all(input_.shape[1:] == img_size for input_ in inputs), (
            "The image size in a batch should be the same."
        )
        test_cfg = preprocessor.test_cfg or {}
        if test_size is not None or test_cfg:
            inputs, padded_samples = stack_batch(
                inputs=inputs,
                size=test_size or test_cfg.get("size", None),
                size_divisor=None if test_size else test_cfg.get("size_divisor", None),
                pad_val=preprocessor.pad_val,
                seg_pad_val=preprocessor.seg_pad_val,
            )
            for data_sample, pad_info in zip(data_samples, padded_samples):
                data_sample.set_metainfo({**pad_info})
        else:
            inputs = torch.stack(inputs, dim=0)

    return dict(inputs=inputs, data_samples=data_samples)
