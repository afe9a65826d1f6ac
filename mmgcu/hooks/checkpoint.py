"""``CPUCheckpointHook``: every tensor in a checkpoint is a plain CPU tensor.

mmengine 0.10.7 moves the model's weights, the optimizer state and the message hub to the
CPU, but not what ``before_save_checkpoint`` hooks add (an EMA model, say). A card tensor
left in a checkpoint opens only where that card's torch_gcu is installed: torch 1.10
pickles an ``xla`` tensor through numpy with its device name, and ``map_location`` does
not apply to it. ``GCURunner`` registers this hook last, so it sees what the others add.
"""

import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


def to_cpu(obj):
    """``obj`` with every tensor in its dicts, lists and tuples moved to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return type(obj)((k, to_cpu(v)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(to_cpu(v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


@HOOKS.register_module()
class CPUCheckpointHook(Hook):
    """Moves what other hooks add to a checkpoint to the CPU, before it is written."""

    priority = "LOWEST"

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        for key, value in checkpoint.items():
            checkpoint[key] = to_cpu(value)
