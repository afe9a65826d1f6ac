"""Tensors on simulated cards.

A :class:`SimTensor` is a wrapper subclass whose ``device`` is a real non-CPU device
(``gcu:i`` or ``xla:i``) while its data lives in a plain CPU tensor. Every aten op is
unwrapped, run on the CPU data and re-wrapped on the same card, after the same device
check PyTorch does on hardware, so a parameter left on the CPU or a batch on another
card fails here exactly as it would on a T20.
"""

import threading
import weakref
from typing import Dict, List, Optional

import torch
from torch.utils._pytree import tree_flatten, tree_map

from .kernels import HOST_KERNELS

aten = torch.ops.aten

# Ops that legally mix devices: copies, and device moves.
_CROSS_DEVICE_OPS = {
    aten.copy_.default,
    aten._to_copy.default,
    aten._copy_from.default,
    aten._copy_from_and_resize.default,
    aten.lift_fresh.default,
}

# The device types a simulated card can have: PrivateUse1 renamed 'gcu' (v2) and XLA (legacy).
SIM_DEVICE_TYPES = ("gcu", "xla")


class MemoryCounter:
    """Bytes held by live tensors on each card, and the peak since the last reset.

    A storage is counted once however many views of it are alive; it is released when
    the last wrapper around it is freed.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._live: Dict[int, Dict[int, List[int]]] = {}  # card -> data_ptr -> [bytes, refs]
        self.allocated: Dict[int, int] = {}
        self.peak: Dict[int, int] = {}

    def track(self, wrapper: torch.Tensor, data: torch.Tensor, card: int) -> None:
        storage = data.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        key = storage.data_ptr()
        with self._lock:
            live = self._live.setdefault(card, {})
            entry = live.get(key)
            if entry is None:
                live[key] = [nbytes, 1]
                now = self.allocated.get(card, 0) + nbytes
                self.allocated[card] = now
                if now > self.peak.get(card, 0):
                    self.peak[card] = now
            else:
                entry[1] += 1
        weakref.finalize(wrapper, self._release, card, key)

    def _release(self, card: int, key: int) -> None:
        with self._lock:
            live = self._live.get(card, {})
            entry = live.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del live[key]
                self.allocated[card] -= entry[0]

    def reset_peak(self, card: int) -> None:
        with self._lock:
            self.peak[card] = self.allocated.get(card, 0)


MEMORY = MemoryCounter()


class SimTensor(torch.Tensor):
    """A tensor on a simulated card; ``_data`` is the CPU tensor that holds its values."""

    _data: torch.Tensor

    @staticmethod
    def __new__(cls, data: torch.Tensor, device: torch.device):
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls,
            data.shape,
            strides=data.stride(),
            storage_offset=data.storage_offset(),
            dtype=data.dtype,
            layout=data.layout,
            device=device,
            requires_grad=False,
        )
        wrapper._data = data
        MEMORY.track(wrapper, data, device.index)
        return wrapper

    def __repr__(self, *, tensor_contents=None):
        text = repr(self._data.detach())
        suffix = f", device='{self.device}'"
        if self.requires_grad:
            suffix += ", requires_grad=True"
        return text[:-1] + suffix + ")"

    def __reduce_ex__(self, protocol):
        # A checkpoint must open anywhere: serialise the host copy, as map_location='cpu'
        # would give on hardware. (Loading without map_location therefore also gives CPU
        # tensors here, where the hardware would restore them onto the card.)
        data = self._data.detach().clone()
        data.requires_grad_(self.requires_grad)
        return data.__reduce_ex__(protocol)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = _common_device(func, args, kwargs)
        if func is aten._to_copy.default:
            return _to_copy(args[0], device, kwargs)
        if func is aten.copy_.default:
            dst, src = args[0], args[1]
            _unwrap(dst).copy_(_unwrap(src), **kwargs)
            return dst
        inputs = {}

        def unwrap(t):
            if isinstance(t, SimTensor):
                inputs[id(t._data)] = t
                return t._data
            return t

        kernel = HOST_KERNELS.get(func, func)
        out = kernel(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))

        def rewrap(t):
            if isinstance(t, torch.Tensor) and not isinstance(t, SimTensor):
                same = inputs.get(id(t))
                return same if same is not None else SimTensor(t, device)
            return t

        return tree_map(rewrap, out)


def _unwrap(t):
    return t._data if isinstance(t, SimTensor) else t


def _to_copy(src, device: torch.device, kwargs):
    kwargs = dict(kwargs)
    target = kwargs.pop("device", None)
    target = device if target is None else torch.device(target)
    data = _unwrap(src)
    if target.type not in SIM_DEVICE_TYPES:
        return aten._to_copy.default(data, device=target, **kwargs)
    out = aten._to_copy.default(data, **kwargs)
    if out is data:
        out = data.clone()
    return SimTensor(out, _indexed(target))


def _indexed(device: torch.device) -> torch.device:
    if device.index is None:
        from . import state

        return torch.device(device.type, state.current_card())
    return device


def _device_mismatch(a, b) -> RuntimeError:
    # PyTorch's own wording, so user code and tests see what the hardware shows.
    return RuntimeError(
        "Expected all tensors to be on the same device, but found at least two "
        f"devices, {a} and {b}!"
    )


def _common_device(func, args, kwargs) -> Optional[torch.device]:
    """The card of the op's SimTensor arguments, after PyTorch's same-device check."""
    flat, _ = tree_flatten((args, kwargs))
    device = None
    cpu_seen = None
    for t in flat:
        if isinstance(t, SimTensor):
            if device is None:
                device = t.device
            elif t.device != device:
                raise _device_mismatch(device, t.device)
        elif isinstance(t, torch.Tensor) and t.dim() > 0 and t.device.type == "cpu":
            cpu_seen = t.device
    if cpu_seen is not None and device is not None and func not in _CROSS_DEVICE_OPS:
        raise _device_mismatch(cpu_seen, device)
    return device


# Factory kernels, registered per dispatch key so they run on every thread (autograd's
# device threads included), not only where a Python dispatch mode is active.
def _empty(*args, device=None, pin_memory=None, **kwargs):
    data = torch.empty(*args, device="cpu", **kwargs)
    return SimTensor(data, _indexed(torch.device(device)))


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    data = torch.empty_strided(size, stride, dtype=dtype, layout=layout, device="cpu")
    return SimTensor(data, _indexed(torch.device(device)))


def _copy_from(src, dst, non_blocking=False):
    _unwrap(dst).copy_(_unwrap(src))
    return dst


_LIBRARIES = []


def register_kernels(dispatch_key: str) -> None:
    """Register the factory and copy kernels of one device's dispatch key."""
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("empty.memory_format", _empty, dispatch_key)
    lib.impl("empty_strided", _empty_strided, dispatch_key)
    lib.impl("_copy_from", _copy_from, dispatch_key)
    _LIBRARIES.append(lib)  # a Library unregisters its kernels when collected
