"""Models for the bad-input rows: what a user's own code can get wrong."""

import torch
from mmseg.models import EncoderDecoder, SegDataPreProcessor
from mmseg.registry import MODELS


@MODELS.register_module()
class LateParamSegmentor(EncoderDecoder):
    """Creates a parameter in init_weights, which the runner calls after wrapping."""

    def init_weights(self):
        super().init_weights()
        self.extra = torch.nn.Parameter(torch.zeros(1))


@MODELS.register_module()
class CpuBatchPreProcessor(SegDataPreProcessor):
    """Returns the batch on the CPU instead of the model's card."""

    def forward(self, data, training=False):
        data = super().forward(data, training)
        data["inputs"] = data["inputs"].cpu()
        return data
