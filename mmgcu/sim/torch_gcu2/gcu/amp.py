"""``torch.gcu.amp`` of torch_gcu 2.x: torch's own autocast and GradScaler for ``gcu``."""

import torch


def autocast(enabled=True, dtype=torch.float16, cache_enabled=True):
    return torch.autocast("gcu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    def __init__(self, *args, **kwargs):
        super().__init__("gcu", *args, **kwargs)
