"""Optimizer wrappers that step and autocast on GCU cards.

``GCURunner`` maps a config's ``OptimWrapper`` / ``AmpOptimWrapper`` (what stock
``tools/train.py --amp`` sets) to these on a GCU, so configs and flags stay stock.
"""

from contextlib import contextmanager
from typing import Optional, Union

import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

from ..device import GCUError, get_backend


def _step(optim_wrapper: OptimWrapper, **kwargs) -> None:
    """One optimizer step; torch_gcu 1.x runs its lazy graph here (once per step)."""
    get_backend().optimizer_step(optim_wrapper.optimizer, **kwargs)


@OPTIM_WRAPPERS.register_module()
class GCUOptimWrapper(OptimWrapper):
    """:class:`OptimWrapper` whose step goes through the device layer.

    On torch_gcu 1.x that is ``torch_gcu.optimizer_step`` (which runs the XLA graph);
    elsewhere it is ``optimizer.step()``. Gradient accumulation is mmengine's: the step
    runs once per ``accumulative_counts`` iterations.
    """

    def step(self, **kwargs) -> None:
        if self.clip_grad_kwargs:
            self._clip_grad()
        _step(self, **kwargs)


@OPTIM_WRAPPERS.register_module()
class GCUAmpOptimWrapper(AmpOptimWrapper):
    """:class:`AmpOptimWrapper` that autocasts on the card with the generation's scaler.

    Stock ``AmpOptimWrapper`` asserts CUDA/NPU/MLU/MUSA and binds ``torch.cuda.amp``;
    this one asks the device layer for autocast and ``GradScaler``.

    Args:
        loss_scale: ``'dynamic'``, a float (static scale) or GradScaler kwargs.
        dtype: ``'float16'`` (default) or ``'bfloat16'`` (torch_gcu 2.x only).
        **kwargs: passed to :class:`OptimWrapper`.
    """

    def __init__(
        self,
        loss_scale: Union[str, float, dict] = "dynamic",
        dtype: Optional[Union[str, torch.dtype]] = None,
        use_fsdp: bool = False,
        **kwargs,
    ):
        if use_fsdp:
            raise GCUError("GCUAmpOptimWrapper does not support use_fsdp=True")
        OptimWrapper.__init__(self, **kwargs)  # skip AmpOptimWrapper's CUDA assertion
        backend = get_backend()
        if isinstance(dtype, str):
            if dtype not in self.valid_dtypes:
                raise GCUError(f"optim_wrapper.dtype={dtype!r}: use one of {self.valid_dtypes}")
            dtype = getattr(torch, dtype)
        self.cast_dtype = dtype or torch.float16
        if self.cast_dtype not in backend.amp_dtypes:
            raise GCUError(
                f"mixed precision with {self.cast_dtype} is not supported on {backend.name} "
                f"({backend.description}); supported: {backend.amp_dtypes or 'none'}"
            )
        self._scale_update_param = None
        if loss_scale == "dynamic":
            self.loss_scaler = backend.grad_scaler()
        elif isinstance(loss_scale, float):
            self._scale_update_param = loss_scale
            self.loss_scaler = backend.grad_scaler(init_scale=loss_scale)
        elif isinstance(loss_scale, dict):
            self.loss_scaler = backend.grad_scaler(**loss_scale)
        else:
            raise TypeError(f'loss_scale must be a float, a dict or "dynamic", got {loss_scale}')

    def step(self, **kwargs) -> None:
        backend = get_backend()
        if not backend.lazy_step:
            super().step(**kwargs)
            return
        # torch_gcu 1.x: the step must be its lazy-graph call, so do GradScaler.step's
        # work with its public API: unscale, skip the step on inf/nan, update the scale.
        self.loss_scaler.unscale_(self.optimizer)
        if self.clip_grad_kwargs:
            self._clip_grad()
        grads = [
            p.grad for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None
        ]
        # One host sync for all gradients (each sync runs the lazy graph on 1.x).
        finite = torch.stack([torch.isfinite(g).all() for g in grads]).all() if grads else True
        if bool(finite):
            _step(self, **kwargs)
        self.loss_scaler.update(self._scale_update_param)

    @contextmanager
    def optim_context(self, model: torch.nn.Module):
        with OptimWrapper.optim_context(self, model), get_backend().autocast(self.cast_dtype):
            yield
