"""Models torch_gcu/core/device.py of a 1.x release: cards are ``xla:N``.

Facts kept from that file: ``set_device`` silently ignores an index that is not a card;
``current_device`` returns None when no card is visible; a device given as a string or
``torch.device`` must be of type ``xla``.
"""

from typing import Any, Optional, Union

import torch

from ... import state

_device_t = Union[torch.device, str, int, None]

__all__ = [
    "is_available",
    "device_count",
    "gcu_device",
    "device",
    "device_of",
    "set_device",
    "current_device",
    "get_device_name",
]


def _device_valid(index: int) -> bool:
    return 0 <= index < state.cards


def _check_device_valid(index: int) -> None:
    if not _device_valid(index):
        raise IndexError(f"Invalid device id, must in [0, {state.cards - 1}], got {index}")


def _get_device_index(device: Any, optional: bool = False) -> int:
    if isinstance(device, str):
        device = torch.device(device)
    index: Optional[int] = None
    if isinstance(device, torch.device):
        if device.type != "xla":
            raise ValueError(f"Expected a gcu device, but got: {device}")
        index = device.index
    if isinstance(device, int):
        index = device
    if index is None:
        if not optional:
            raise ValueError(
                f"Expected a torch.device with a specified index or an integer, but got:{device}"
            )
        index = state.current_card()
    return index


def is_available() -> bool:
    return state.cards > 0


def device_count() -> int:
    return state.cards


def gcu_device(device: _device_t = None) -> torch.device:
    return torch.device(f"xla:{_get_device_index(device, optional=True)}")


def set_device(device: _device_t) -> None:
    index = _get_device_index(device)
    if _device_valid(index):  # as in 1.x: an invalid index is ignored without a word
        state.ext.set_device(index)


def current_device() -> Optional[int]:
    if is_available():
        return state.current_card()
    return None


def get_device_name(device: Optional[_device_t] = None) -> str:
    _check_device_valid(_get_device_index(device, optional=True))
    return "T20 (simulated)"


class device:
    """Context manager that makes a card current (a no-op for an index that is not a card)."""

    def __init__(self, device: Any):
        self.idx = _get_device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self):
        if not _device_valid(self.idx):
            return
        self.prev_idx = current_device()
        if self.prev_idx != self.idx:
            set_device(self.idx)

    def __exit__(self, *exc):
        if self.prev_idx != self.idx:
            set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the card of ``obj`` current."""

    def __init__(self, obj):
        super().__init__(obj.device if obj.device.type == "xla" else -1)
