"""mmcv compiled ops that mmseg models call, made of ordinary tensor ops for GCU cards.

mmcv 2.1.0 runs each compiled op (``mmcv._ext``) through a registry keyed by the input's
device type (``REGISTER_DEVICE_IMPL(psamask_forward_impl, CPU, ...)`` in ``psamask.cpp``, and
the CUDA kernels in a CUDA build): an input on any other device fails with
``<op>_impl: implementation for device gcu:1 not found`` (torch_gcu 2.x) or ``... xla:1``
(torch_gcu 1.x). No Enflame kernel for them is public, so a model that calls one cannot run on
a GCU card. This module gives such ops a card path without patching mmcv or mmseg:
:func:`convert_gcu_mmcv_ops` puts a counterpart made of ordinary tensor ops in place of each
one in a built model.

What stock mmseg 1.2.2 calls from ``mmcv.ops`` (read from its source):

- Compiled ops a stock model can call (paths under ``mmseg/``):

  - ``PSAMask``: ``models/decode_heads/psa_head.py`` (``PSAHead``, the PSANet configs; one
    per direction with ``psa_type='bi-direction'``), in training and inference.
  - ``DeformConv2d`` / ``ModulatedDeformConv2d`` (``DCN`` / ``DCNv2``, registered by
    ``mmcv.ops``): only when a config gives the ``Bottleneck`` of ``ResNet`` (V1c, V1d),
    ``ResNeXt`` or ``ResNeSt`` a ``dcn`` dict (``models/backbones/resnet.py``, built with
    ``build_conv_layer(dcn, ...)``); no config shipped with mmseg 1.2.2 does.
    ``engine/optimizers/force_default_constructor.py`` imports them only for ``isinstance``.
  - ``sigmoid_focal_loss``: ``models/losses/focal_loss.py`` (``FocalLoss``), only when
    ``torch.cuda.is_available() and pred.is_cuda``; on a GCU card it takes its own
    ``py_sigmoid_focal_loss`` (pure PyTorch). No shipped config uses mmseg's ``FocalLoss``
    (MaskFormer's is ``mmdet.FocalLoss``).

- Imported from ``mmcv.ops`` but pure PyTorch in mmcv 2.1.0 (no ``mmcv._ext`` call):

  - ``CrissCrossAttention``: ``models/decode_heads/cc_head.py`` (CCNet); ``einsum``,
    ``softmax`` and ``torch.diag`` (``mmcv/ops/cc_attention.py``).
  - ``point_sample``: ``models/decode_heads/point_head.py`` (PointRend),
    ``models/decode_heads/san_head.py`` (SAN), ``models/utils/point_sample.py``,
    ``utils/mask_classification.py``; a wrapper of ``F.grid_sample``.

- Everything else mmseg takes from mmcv is pure PyTorch (``mmcv.cnn``: ``ConvModule``,
  ``NonLocal2d``, the transformer bricks) or host-side (``mmcv.transforms``, ``mmcv.im*``).
  The Mask2Former / MaskFormer heads wrap mmdet's heads (outside mmseg, not covered here).
  SyncBN layers are ``GCUSyncBatchNorm``'s business (``sync_bn.py``).

Importing ``mmseg.models`` or ``mmseg.utils`` imports ``mmcv.ops`` (and so loads the
compiled extension) through ``point_sample``; mmgcu itself never imports it.

Replaced here: ``PSAMask`` by :class:`GCUPSAMask`.

``GCUPSAMask`` computes what mmcv's CPU kernel (``psamask.cpp``) computes: with
``half = (mask - 1) // 2`` per axis, for each pixel ``q = (qh, qw)`` and each mask cell
``(i, j)`` whose target ``p = (qh + i - half_h, qw + j - half_w)`` lies in the feature map,

- ``'collect'``:    ``out[n, p, q] = in[n, i * w_mask + j, q]``
- ``'distribute'``: ``out[n, q, p] = in[n, i * w_mask + j, q]``

and every other output value is 0 (``p`` and ``q`` flattened as ``h * W + w``). That is one
gather from the input with a zero appended along each mask axis: the mask cell of ``(p, q)``
is ``(ph - qh + half_h, pw - qw + half_w)``, or the zero when it falls outside the mask. The
height and width parts are independent, so the gather takes four small broadcast index
tensors (``H x H``, ``W x W`` and two ranges), made once per shape and device, not an index
per output value. Each input value lands in at most one output place, so the gradient that
autograd gives (a scatter-add of the output gradient) is mmcv's backward exactly, zeros
included for the mask cells that fall outside the map. No host reads, no Python loop over
pixels.
"""

import functools
import sys
from collections import Counter
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch.nn.modules.utils import _pair

__all__ = ["GCUPSAMask", "convert_gcu_mmcv_ops"]

_PSA_TYPES = {"collect": 0, "distribute": 1}


@functools.lru_cache(maxsize=32)
def _psa_indices(
    psa_type: int, h: int, w: int, h_mask: int, w_mask: int, device: torch.device
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Index tensors (mask row, mask column, row, column) into the input padded with a zero
    along both mask axes, broadcasting to the output's ``(H, W, H, W)``."""

    def cell(size: int, mask: int) -> torch.Tensor:
        # [p, q]: the mask cell p - q + half, or ``mask`` (the appended zero) outside the mask
        pos = torch.arange(size)
        offset = pos.view(-1, 1) - pos.view(1, -1) + (mask - 1) // 2
        return offset.masked_fill((offset < 0) | (offset >= mask), mask)

    rows, cols = cell(h, h_mask), cell(w, w_mask)
    if psa_type == 0:  # collect: output dims (ph, pw, qh, qw)
        index = (
            rows.view(h, 1, h, 1),
            cols.view(1, w, 1, w),
            torch.arange(h).view(1, 1, h, 1),
            torch.arange(w).view(1, 1, 1, w),
        )
    else:  # distribute: output dims (qh, qw, ph, pw)
        index = (
            rows.t().reshape(h, 1, h, 1),
            cols.t().reshape(1, w, 1, w),
            torch.arange(h).view(h, 1, 1, 1),
            torch.arange(w).view(1, w, 1, 1),
        )
    return tuple(t.to(device) for t in index)


class GCUPSAMask(torch.nn.Module):
    """mmcv's ``PSAMask`` (PSANet's point-wise spatial attention mask) from ordinary ops.

    Same arguments and attributes as ``mmcv.ops.PSAMask``: ``psa_type`` ``'collect'`` or
    ``'distribute'`` (or 0 / 1), ``mask_size`` ``(h_mask, w_mask)`` (an int: square). Input
    ``N x (h_mask * w_mask) x H x W``, output ``N x (H * W) x H x W``, the same values and
    input gradient as mmcv's kernels on any device (see the module docstring).
    """

    #: What it stands in for, and how a card runs it (``mmgcu rehearse`` reports both).
    mmcv_op = "PSAMask"
    card_path = "ordinary tensor ops on the card (one gather)"

    def __init__(
        self,
        psa_type: Union[str, int],
        mask_size: Optional[Union[int, Sequence[int]]] = None,
    ):
        super().__init__()
        if psa_type in (0, 1):
            psa_type = "collect" if psa_type == 0 else "distribute"
        if psa_type not in _PSA_TYPES:
            raise ValueError(f"psa_type must be 'collect' or 'distribute', not {psa_type!r}")
        self.psa_type = psa_type
        self.psa_type_enum = _PSA_TYPES[psa_type]
        self.mask_size = mask_size

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        h_mask, w_mask = _pair(self.mask_size)  # an int is a square mask, as in mmcv
        n, channels, h, w = input.shape
        if channels != h_mask * w_mask:
            raise ValueError(
                f"PSAMask with mask_size {(h_mask, w_mask)} needs "
                f"{h_mask * w_mask} channels, got {channels}"
            )
        index = _psa_indices(self.psa_type_enum, h, w, h_mask, w_mask, input.device)
        # a zero after the last row and the last column of the mask: the outside's value
        padded = F.pad(input.reshape(n, h_mask, w_mask, h, w), (0, 0, 0, 0, 0, 1, 0, 1))
        out = padded[(slice(None),) + index]  # (N, H, W, H, W)
        return out.reshape(n, h * w, h, w).contiguous()

    def extra_repr(self) -> str:
        return f"psa_type={self.psa_type}, mask_size={self.mask_size}"


def _mmcv_op_counterparts():
    """``(mmcv class, builder of its counterpart)`` for the mmcv ops loaded in this process.

    A model holding an ``mmcv.ops`` layer has imported its module, so an op whose module is
    not in ``sys.modules`` cannot be in the model: nothing here imports ``mmcv.ops`` (which
    loads the compiled extension) or fails where mmcv has no ops (mmcv-lite).
    """
    pairs = []
    psa_mask = sys.modules.get("mmcv.ops.psa_mask")
    if psa_mask is not None and hasattr(psa_mask, "PSAMask"):
        pairs.append((psa_mask.PSAMask, lambda m: GCUPSAMask(m.psa_type, m.mask_size)))
    return pairs


def convert_gcu_mmcv_ops(
    module: torch.nn.Module,
) -> Tuple[torch.nn.Module, List[Tuple[str, int]]]:
    """``module`` with every mmcv compiled op that has a GCU counterpart replaced by it.

    Replaced: ``mmcv.ops.PSAMask`` (and subclasses) by :class:`GCUPSAMask` with the same
    ``psa_type`` and ``mask_size``; neither has parameters or buffers, so state-dict keys do
    not change. Children are replaced in place on their parents (as mmengine's
    ``revert_sync_batchnorm`` walks them); the training flag is kept.

    Returns:
        ``(module, replaced)``: the module (a new one if it is itself a replaced op) and
        ``[(mmcv class name, count), ...]`` sorted by name, empty when nothing was replaced,
        for one log line.
    """
    pairs = _mmcv_op_counterparts()
    counts: Counter = Counter()
    if not pairs:
        return module, []

    def convert(mod: torch.nn.Module) -> torch.nn.Module:
        output = mod
        for op_type, build in pairs:
            if isinstance(mod, op_type):
                output = build(mod)
                output.train(mod.training)
                counts[op_type.__name__] += 1
                break
        for name, child in mod.named_children():
            output.add_module(name, convert(child))
        return output

    module = convert(module)
    return module, sorted(counts.items())
