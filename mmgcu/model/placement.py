"""Where the model and its batches must be: on this rank's card, checked once.

Every placement check of mmgcu (the DDP wrappers, the first batch, the placement hook)
words what it finds here, so a misplaced tensor reads the same wherever it is caught.
"""

from typing import List, Tuple

import torch

from ..errors import GCUError

_SHOWN = 5


def misplaced(module: torch.nn.Module, device: torch.device) -> List[Tuple[str, torch.device]]:
    """Names and devices of the parameters and buffers of ``module`` not on ``device``."""
    tensors = list(module.named_parameters()) + list(module.named_buffers())
    return [(name, t.device) for name, t in tensors if t.device != device]


def misplaced_message(who: str, device, wrong) -> str:
    """What is off the card, in the words every placement check uses."""
    shown = ", ".join(f"{name} on {dev}" for name, dev in wrong[:_SHOWN])
    more = " ..." if len(wrong) > _SHOWN else ""
    return (
        f"{who}: {len(wrong)} parameter(s)/buffer(s) are not on its card {device}: "
        f"{shown}{more}. Create parameters in the model's __init__ and let GCURunner move "
        "the model to the card; do not move or create them after it is wrapped."
    )


def check_placement(module: torch.nn.Module, device: torch.device, who: str) -> None:
    wrong = misplaced(module, device)
    if wrong:
        raise GCUError(misplaced_message(who, device, wrong))


def _devices(data) -> set:
    if isinstance(data, torch.Tensor):
        return {data.device}
    if isinstance(data, dict):
        data = list(data.values())
    if isinstance(data, (list, tuple)):
        return set().union(*(_devices(d) for d in data)) if data else set()
    return set()


def watch_first_batch(model: torch.nn.Module, device: torch.device) -> None:
    """Check, once, that the data preprocessor puts the batch on the card.

    A custom preprocessor that leaves the batch on the CPU would otherwise fail deep
    inside the first convolution. The forward hook removes itself after the first batch.
    """
    preprocessor = getattr(model, "data_preprocessor", None)
    if not isinstance(preprocessor, torch.nn.Module):
        return

    def check(module, inputs, output):
        handle.remove()
        wrong = sorted(str(d) for d in _devices(output) if d != device)
        if wrong:
            raise GCUError(
                f"the data preprocessor ({type(module).__name__}) returned a batch on "
                f"{', '.join(wrong)}, but the model is on {device}. Move the batch with "
                "BaseDataPreprocessor.cast_data (or self.device) in its forward; mmengine's "
                "preprocessors do this when they are not overridden."
            )

    handle = preprocessor.register_forward_hook(check)


def watch_late_parameters(model: torch.nn.Module, device: torch.device, held) -> None:
    """Check, once, at the end of the first forward pass, that it created no parameter.

    A parameter created in the first forward pass is not in the optimizer (built before)
    nor in DDP's buckets, so it never trains nor is all-reduced, and one created on the
    CPU stays there; nothing else fails. ``held()``: the parameters the optimizer holds.
    Only trainable parameters that did not exist when this was armed count (an optimizer
    may leave out frozen ones on purpose). The forward hook removes itself, so no later
    iteration runs it.
    """
    before = {id(p) for p in model.parameters()}

    def check(module, inputs, output):
        handle.remove()
        ids = before | {id(p) for p in held()}
        late = [
            (name, p.device)
            for name, p in module.named_parameters()
            if p.requires_grad and id(p) not in ids
        ]
        if late:
            shown = ", ".join(f"{name} on {dev}" for name, dev in late[:_SHOWN])
            raise GCUError(
                f"{len(late)} parameter(s) of the model were created after it was wrapped (in "
                f"its first forward pass) and are not in the optimizer: {shown}. They never "
                "train and DDP never all-reduces them. Create parameters in the model's "
                "__init__, so that GCURunner puts them on the card and the optimizer holds them."
            )
        wrong = misplaced(module, device)
        if wrong:
            raise GCUError(misplaced_message("after the first forward pass", device, wrong))

    handle = model.register_forward_hook(check)
