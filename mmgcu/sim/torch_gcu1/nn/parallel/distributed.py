"""Models torch_gcu/nn/parallel/distributed.py of a 1.x release.

Its ``DistributedDataParallel`` subclasses ``torch.nn.Module``, not torch's DDP, and has
its own constructor (no ``static_graph``). Facts kept from that file:

- ``device_ids=None`` on a module on a card means every visible card: the module is
  replicated onto all of them in this one process (single-process multi-card mode).
  The simulator does not model that mode and refuses it; Enflame's own scripts always
  pass ``device_ids=[local_rank]``. More than one id given: RuntimeError.
- With ``device_ids`` the inputs are scattered (moved) onto ``device_ids[0]``.
- ``process_group=None`` means torch_gcu's default (ECCL) group, not torch.distributed's.
- ``gradient_as_bucket_view=True`` raises on a card; ``bucket_cap_mb`` defaults to 256.
- Parameters and buffers are broadcast from the group's first rank when it is built.

Gradients are averaged over the group when a backward pass ends (the real Reducer is C++).
With ``find_unused_parameters=True`` a parameter without a gradient takes part as zeros
and gets the group's average (the real Reducer leaves a parameter that no rank used
without a gradient; telling that apart needs a host read, which the simulator avoids);
without it, such a parameter fails as torch's DDP fails.
"""

import contextlib

import torch

from .... import state
from ...core.device import _get_device_index, device_count
from ...distributed import ReduceOp, _get_default_group, all_reduce, broadcast


def _to_card(obj, card: torch.device):
    if isinstance(obj, torch.Tensor):
        return obj.to(card)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_card(o, card) for o in obj)
    if isinstance(obj, dict):
        return type(obj)((k, _to_card(v, card)) for k, v in obj.items())
    return obj


class DistributedDataParallel(torch.nn.Module):
    def __init__(
        self,
        module,
        device_ids=None,
        output_device=None,
        dim=0,
        broadcast_buffers=True,
        process_group=None,
        bucket_cap_mb=256,
        find_unused_parameters=False,
        check_reduction=False,
        gradient_as_bucket_view=False,
    ):
        super().__init__()
        self._check_module(module, device_ids)
        devices = {p.device for p in module.parameters()}
        self.device_type = devices.copy().pop().type
        self._set_devices(devices, device_ids, output_device)
        self.process_group = process_group if process_group is not None else _get_default_group()
        if self.device_type == "xla" and gradient_as_bucket_view:
            raise RuntimeError(
                "dtu not support `gradient_as_bucket_view` set to True"
                "please set gradient_as_bucket_view to False"
            )
        self.dim = dim
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.bucket_bytes_cap = int(bucket_cap_mb * 1024 * 1024)
        for tensor in module.state_dict().values():
            broadcast(tensor, -1, self.process_group)
        self._check_single_card()
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._armed = self._queued = False
        for p in self._params:
            p.register_hook(self._on_grad)

    @staticmethod
    def _check_module(module, device_ids) -> None:
        assert any(p.requires_grad for p in module.parameters()), (
            "DistributedDataParallel is not needed when a module "
            "doesn't have any parameter that requires a gradient."
        )
        if device_ids is not None and len(device_ids) > 1:
            raise RuntimeError("device_ids can only be None or contain a single element.")
        types = {p.device.type for p in module.parameters()}
        assert len(types) == 1, (
            "DistributedDataParallel's input module must be on the same type of devices, "
            f"but input module parameters locate in {types}."
        )

    def _set_devices(self, devices, device_ids, output_device) -> None:
        if self.device_type == "cpu" or len(devices) > 1:
            assert not device_ids and not output_device, (
                "DistributedDataParallel device_ids and output_device arguments only work "
                f"with single-device GPU modules, but got device_ids {device_ids}, "
                f"output_device {output_device}, and module parameters {devices}."
            )
            self.device_ids = self.output_device = None
            return
        if device_ids is None:  # every visible card
            device_ids = list(range(device_count()))
        self.device_ids = [_get_device_index(d, True) for d in device_ids]
        if output_device is None:
            output_device = device_ids[0]
        self.output_device = _get_device_index(output_device, True)

    def _check_single_card(self) -> None:
        if self.device_ids and len(self.device_ids) > 1:
            raise NotImplementedError(
                "simulated torch_gcu 1.x: DistributedDataParallel without device_ids "
                f"replicates the module onto every visible card {self.device_ids} in this "
                "one process (single-process multi-card mode), which the simulator does not "
                "model. Pass device_ids=[this rank's card]."
            )

    @contextlib.contextmanager
    def no_sync(self):
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def forward(self, *inputs, **kwargs):
        if self.device_ids:
            card = torch.device("xla", self.device_ids[0])
            inputs, kwargs = _to_card(inputs, card), _to_card(kwargs, card)
        if self.require_forward_param_sync and self.broadcast_buffers:
            for buf in self.module.buffers():
                broadcast(buf, -1, self.process_group)
        output = self.module(*inputs, **kwargs)
        grad_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        self.require_forward_param_sync = grad_sync
        self._armed = self._armed or grad_sync
        return output

    def _on_grad(self, grad):
        if self._armed and not self._queued:
            self._queued = True
            # Through the simulator: a collective's error must reach backward()'s caller, as
            # the real (C++) Reducer's does.
            state.ext.queue_backward_callback(self._reduce_gradients)
        return grad

    def _reduce_gradients(self) -> None:
        self._armed = self._queued = False
        missing = [p for p in self._params if p.grad is None]
        if missing and not self.find_unused_parameters:
            raise RuntimeError(
                "Expected to have finished reduction in the prior iteration before starting "
                "a new one. This error indicates that your module has parameters that were "
                "not used in producing loss. You can enable unused parameter detection by "
                "passing the keyword argument `find_unused_parameters=True` to "
                "`torch_gcu.nn.parallel.DistributedDataParallel`."
            )
        for p in missing:
            p.grad = torch.zeros_like(p)
        world = self.process_group.size()
        for bucket in self._buckets():
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            all_reduce(flat, ReduceOp.SUM, self.process_group)
            flat.div_(world)
            offset = 0
            for p in bucket:
                n = p.grad.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                offset += n

    def _buckets(self):
        bucket, size = [], 0
        for p in self._params:
            if bucket and (size >= self.bucket_bytes_cap or p.grad.dtype != bucket[0].grad.dtype):
                yield bucket
                bucket, size = [], 0
            bucket.append(p)
            size += p.grad.numel() * p.grad.element_size()
        if bucket:
            yield bucket
