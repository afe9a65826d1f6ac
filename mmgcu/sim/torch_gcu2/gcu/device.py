"""The device functions of torch.gcu, over the native part's cards, counters and state."""

import torch

from ... import state


def _card(device=None) -> int:
    if device is None:
        return state.current_card()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index if device.index is not None else state.current_card()


def is_available() -> bool:
    return state.cards > 0


def device_count() -> int:
    return state.cards


def current_device() -> int:
    return state.current_card()


def set_device(device) -> None:
    state.ext.set_device(state.check_card(_card(device)))


def synchronize(device=None) -> None:
    """Host memory is synchronous; nothing to wait for."""


def memory_allocated(device=None) -> int:
    return state.ext.memory_allocated(_card(device))


def max_memory_allocated(device=None) -> int:
    return state.ext.max_memory_allocated(_card(device))


def reset_peak_memory_stats(device=None) -> None:
    state.ext.reset_peak(_card(device))


def empty_cache() -> None:
    """No caching allocator to drain (freed card memory is released at once); counted."""
    state.counters["empty_cache"] += 1


def mem_get_info(device=None):
    total = 32 * 1024**3  # the card memory of a T20 (the simulator models 32 GiB for both)
    return total - memory_allocated(device), total


def memory_stats(device=None) -> dict:
    return {
        "allocated_bytes.all.current": memory_allocated(device),
        "allocated_bytes.all.peak": max_memory_allocated(device),
    }


def get_device_name(device=None) -> str:
    return f"{state.hardware} (simulated, card {_card(device)})"


def manual_seed(seed: int) -> None:
    manual_seed_all(seed)


def manual_seed_all(seed: int) -> None:
    # Card ops run on the host, so their random numbers come from the CPU generator. Not
    # torch.manual_seed: it calls this very function (torch.gcu.manual_seed_all).
    torch.default_generator.manual_seed(int(seed))
    for card in range(state.cards):
        state.ext.manual_seed(card, int(seed))
