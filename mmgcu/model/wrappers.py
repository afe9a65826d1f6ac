"""``GCUDistributedDataParallel``: mmengine's DDP wrapper for GCU cards."""

from typing import Dict, Tuple, Type

import torch
from mmengine.model import MMDistributedDataParallel
from mmengine.registry import MODEL_WRAPPERS

from ..device import GCUError, get_backend
from ..dist import device_group

_rebased: Dict[Tuple[Type, Type], Type] = {}


def _on_base(cls: Type, base: Type) -> Type:
    """``cls`` re-based on a vendor DDP class (torch_gcu 1.x has its own)."""
    key = (cls, base)
    if key not in _rebased:
        _rebased[key] = type(cls.__name__, (cls, base), {"__module__": cls.__module__})
    return _rebased[key]


def misplaced(module: torch.nn.Module, device: torch.device):
    """Names of the parameters and buffers of ``module`` that are not on ``device``."""
    tensors = list(module.named_parameters()) + list(module.named_buffers())
    return [(name, t.device) for name, t in tensors if t.device != device]


@MODEL_WRAPPERS.register_module()
class GCUDistributedDataParallel(MMDistributedDataParallel):
    """An :class:`MMDistributedDataParallel` for the current rank's GCU card.

    It builds over torch DDP on torch_gcu 2.x and over
    ``torch_gcu.nn.parallel.DistributedDataParallel`` on 1.x, adds the device
    arguments the generation needs, and refuses a module that is not on this rank's
    card (naming the parameters), instead of DDP's "device_ids ... module parameters
    {device(type='cpu')}" (seeds 000/001).

    Args:
        module: the model, already on this rank's card (``GCURunner.wrap_model`` moves it).
        detect_anomalous_params: see :class:`MMDistributedDataParallel`.
        **kwargs: DDP options (``broadcast_buffers``, ``bucket_cap_mb``, ...). A
            ``device_ids``/``output_device`` must name this rank's card or be left out.
    """

    def __new__(cls, *args, **kwargs):
        base = get_backend().ddp_class()
        if not issubclass(cls, base):
            cls = _on_base(cls, base)
        return super().__new__(cls)

    def __init__(self, module, detect_anomalous_params: bool = False, **kwargs):
        backend = get_backend()
        card = backend.current_device()
        device = backend.device(card)
        wrong = misplaced(module, device)
        if wrong:
            shown = ", ".join(f"{n} on {d}" for n, d in wrong[:5])
            raise GCUError(
                f"{len(wrong)} parameter(s)/buffer(s) are not on this rank's card {device}: "
                f"{shown}{' ...' if len(wrong) > 5 else ''}. Move the model with "
                f"model.to('{device}') before wrapping it (GCURunner does this), and do "
                "not create parameters after wrapping."
            )
        device_kwargs = backend.ddp_device_kwargs(card)
        for key in ("device_ids", "output_device"):
            given = kwargs.pop(key, None)
            if given is not None and given != device_kwargs.get(key):
                raise GCUError(
                    f"model_wrapper_cfg.{key}={given} but this rank trains on card {card} "
                    f"({device}), which needs {key}={device_kwargs.get(key)}. Remove "
                    f"{key} from model_wrapper_cfg: mmgcu sets it for every rank."
                )
        kwargs.update(device_kwargs)
        if device_group() is not None:
            kwargs.setdefault("process_group", device_group())
        super().__init__(module, detect_anomalous_params=detect_anomalous_params, **kwargs)
