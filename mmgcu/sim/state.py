"""What the installed simulator knows: its flavour, its cards and the native extension."""

from typing import Optional

ext = None  # the compiled extension (mmgcu/sim/csrc), set by install()
api: Optional[str] = None  # 'v2' or 'legacy'
cards: int = 0  # cards visible to this process
device_type: Optional[str] = None  # 'gcu' (v2) or 'xla' (legacy)
# Calls the plugin made into the simulated vendor API, so tests can check it drives it
# (the legacy lazy step once per optimizer step, empty_cache where configured).
calls = {"optimizer_step": 0, "unlazy": 0, "sync_lived_tensor": 0, "empty_cache": 0}


def current_card() -> int:
    return ext.current_device() if ext is not None else 0


def check_card(index) -> int:
    """The index of a card, refused like a driver refuses a card that is not there."""
    index = int(index)
    if not 0 <= index < cards:
        raise RuntimeError(
            f"GCU device ordinal {index} is invalid: {cards} card(s) are visible "
            "(simulated; see TOPS_VISIBLE_DEVICES)"
        )
    return index
