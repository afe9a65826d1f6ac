"""torch_gcu 2.x's mixed precision beyond torch's own: the zero step on overflow.

Imported only by ``gcu2.py`` when asked for (``torch.amp.GradScaler`` is torch >= 2.3).
"""

import torch


class ZeroStepGradScaler(torch.amp.GradScaler):
    """torch's GradScaler whose overflowed step is a zero step, as torch_gcu 1.x's
    ``GradScaler(use_zero_grad=True)``: the gradients' NaNs are cleared and every gradient
    is multiplied by ``found_inf == 0`` on the card, then the optimizer steps.

    torch's own decides to skip with ``found_inf.item()``: one wait for the card per step.
    A zero step is not a skipped one: weight decay and momentum still move the weights,
    and Adam's step count and moments advance. The loss scale backs off as with torch's.
    Optimizers built with ``fused=True`` take ``found_inf`` themselves and skip without a
    read either way (torch's GradScaler does not call this method for them).

    Overrides ``GradScaler._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)``
    of torch 2.13 (two elementwise passes over the gradients per step); a test fails when
    torch changes that method's signature or stops calling it.
    """

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        found = list(optimizer_state["found_inf_per_device"].values())
        keep = (torch.stack([f.to(found[0].device) for f in found]).sum() == 0).float()
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    param.grad.nan_to_num_().mul_(keep.to(param.grad.device, param.grad.dtype))
        return optimizer.step(*args, **kwargs)
