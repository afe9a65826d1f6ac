"""Optimizer wrappers that step and autocast on GCU cards.

On a GCU ``GCURunner`` builds these for a config's ``OptimWrapper``/``AmpOptimWrapper``
(what stock ``tools/train.py --amp`` sets), and binds them to its accelerator, model and
message hub as it binds every GCU class (:meth:`CardStep.bind`, :mod:`mmgcu.binding`): the
step is the accelerator's, which on torch_gcu 1.x is
``torch_gcu.optimizer_step(optimizer, [loss], model=model, mode=...)``, the lazy graph run.
Built by another runner (no ``bind``), they are mmengine's wrappers: ``GCUOptimWrapper``
steps as ``OptimWrapper`` does; ``GCUAmpOptimWrapper``, like ``AmpOptimWrapper``, needs CUDA.
"""

from contextlib import contextmanager
from typing import Optional, Union

import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

from ..binding import Binding, CardBound, say_off_card
from ..compat.mmengine import TensorGradNorm, init_amp_optim_wrapper
from ..counterparts import replaces
from ..device import Accelerator
from ..device.fallback import CUDAAccelerator
from ..errors import GCUError


class CardStep(CardBound, TensorGradNorm):
    """What both GCU optimizer wrappers share: the accelerator and model a step runs on,
    the last loss given to ``update_params``, which a lazy device's graph takes as an
    output, and a clipped gradient norm logged as the card tensor it is."""

    model: Optional[torch.nn.Module] = None
    _loss: Optional[torch.Tensor] = None
    off_card = "acts as mmengine's optimizer wrapper"

    def bind(self, binding: Binding) -> None:
        """Step on the accelerator's card for ``binding.model`` (``GCURunner`` calls this);
        log the gradient norm to ``binding.message_hub`` (the runner's, which can keep it
        on the card)."""
        super().bind(binding)
        self.model = binding.model
        if binding.message_hub is not None:
            self.message_hub = binding.message_hub

    def update_params(self, loss: torch.Tensor, step_kwargs=None, zero_kwargs=None) -> None:
        # The loss as the model gave it (mmengine divides it by the accumulation count, a
        # new tensor): the one whose value the log will read, so the graph outputs it.
        self._loss = loss.detach()
        super().update_params(loss, step_kwargs, zero_kwargs)


@OPTIM_WRAPPERS.register_module()
@replaces(
    OptimWrapper,
    why="its step knows nothing of a lazy device: on torch_gcu 1.x nothing would run the graph",
    does={
        "lazy": "its step is the lazy card's (torch_gcu.optimizer_step on torch_gcu 1.x), "
        "which runs the graph once per optimizer step",
        "*": "it steps on the card and logs the gradient norm without reading it from the card",
    },
)
class GCUOptimWrapper(CardStep, OptimWrapper):
    """:class:`OptimWrapper` whose step is the accelerator's (once per optimizer step, so
    with ``accumulative_counts`` once per accumulation)."""

    def step(self, **kwargs) -> None:
        accelerator = self.accelerator
        if accelerator is None:  # built by another runner: mmengine's step
            say_off_card(self, None)
            return super().step(**kwargs)
        if self.clip_grad_kwargs:
            self.clip_grad()
        accelerator.optimizer_step(self.optimizer, self.model, self._loss, **kwargs)


@OPTIM_WRAPPERS.register_module()
@replaces(
    AmpOptimWrapper,
    why="the stock one asserts CUDA and autocasts on get_device(), the CPU of a GCU host",
    does="it autocasts on the card and scales the loss with the card's GradScaler",
)
class GCUAmpOptimWrapper(CardStep, AmpOptimWrapper):
    """:class:`AmpOptimWrapper` with the card's autocast and ``GradScaler``.

    Args:
        loss_scale: ``'dynamic'``, a float (static scale) or ``GradScaler`` arguments.
        dtype: ``'float16'`` (default) or ``'bfloat16'``.
        overflow_step: what a step whose gradients overflowed does. ``'skip'`` (torch's
            GradScaler, the default on torch_gcu 2.x and CUDA): the optimizer does not
            step, which the host decides by reading the card once per step. ``'zero'``
            (torch_gcu 1.x's only way, available on 2.x): no read; the optimizer steps with
            zero gradients, so weight decay and momentum still move the weights and Adam's
            step count advances. None: the card's default.
        **kwargs: passed to :class:`OptimWrapper`.

    ``AmpOptimWrapper.__init__`` asserts CUDA and builds ``torch.cuda.amp.GradScaler``, so
    this ``__init__`` takes the same arguments and does the rest of it
    (:func:`mmgcu.compat.mmengine.init_amp_optim_wrapper`); the card's scaler is made at
    :meth:`bind`.
    """

    def __init__(
        self,
        loss_scale: Union[str, float, dict] = "dynamic",
        dtype: Optional[Union[str, torch.dtype]] = None,
        use_fsdp: bool = False,
        overflow_step: Optional[str] = None,
        **kwargs,
    ):
        if use_fsdp:
            raise GCUError("GCUAmpOptimWrapper does not support use_fsdp=True")
        self._scaler_args = init_amp_optim_wrapper(self, loss_scale, **kwargs)
        if isinstance(dtype, str):
            if dtype not in self.valid_dtypes:
                raise GCUError(f"optim_wrapper.dtype={dtype!r}: use one of {self.valid_dtypes}")
            dtype = getattr(torch, dtype)
        self.cast_dtype = dtype or torch.float16
        self.overflow_step = overflow_step
        self.loss_scaler = None

    def bind(self, binding: Binding) -> None:
        accelerator = binding.accelerator
        if self.cast_dtype not in accelerator.amp_dtypes:
            raise GCUError(
                f"mixed precision with {self.cast_dtype} is not supported on "
                f"{accelerator.kind} ({accelerator.description}); supported: "
                f"{accelerator.amp_dtypes or 'none'}"
            )
        super().bind(binding)
        if self.loss_scaler is None:
            self.loss_scaler = accelerator.grad_scaler(self.overflow_step, **self._scaler_args)

    def _bound(self) -> Accelerator:
        """The accelerator ``bind`` gave; unbound, CUDA's, as mmengine's AmpOptimWrapper."""
        if self.accelerator is None:
            if not torch.cuda.is_available():
                raise GCUError(
                    f"{type(self).__name__} was not built by GCURunner, so it has no card, "
                    "and mmengine's AmpOptimWrapper, which it then acts as, needs CUDA (none "
                    "here). Train with runner_type='GCURunner' (tools/train.py honours it)."
                )
            say_off_card(self, None)
            self.bind(Binding(CUDAAccelerator(), self.model, self.message_hub))
        return self.accelerator

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        self._bound()  # the loss scaler comes with the accelerator
        super().backward(loss, **kwargs)

    def state_dict(self) -> dict:
        self._bound()
        return super().state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self._bound()
        super().load_state_dict(state_dict)

    def step(self, **kwargs) -> None:
        accelerator = self._bound()
        super().step(**kwargs)  # unscale and clip, scaler.step, scaler.update
        accelerator.after_amp_step(self.optimizer, self.model, self.loss_scaler, self._loss)

    @contextmanager
    def optim_context(self, model: torch.nn.Module):
        # AmpOptimWrapper's context autocasts on get_device(); this one on the card.
        with OptimWrapper.optim_context(self, model), self._bound().autocast(self.cast_dtype):
            yield
