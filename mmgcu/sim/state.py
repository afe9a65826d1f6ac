"""What the installed simulator knows: its flavour, its cards, the native part and its counters."""

import collections
from typing import Optional

ext = None  # the compiled extension (mmgcu/sim/csrc), set by install()
api: Optional[str] = None  # 'gcu2' or 'gcu1'
cards: int = 0  # cards visible to this process
device_type: Optional[str] = None  # 'gcu' (torch_gcu 2.x) or 'xla' (torch_gcu 1.x)
hardware: Optional[str] = None  # 'T20' (torch_gcu 1.x) or 'S60' (2.x)
#: Vendor calls this process made, and the lazy graphs it ran (torch_gcu 1.x), so tests and
#: the benchmark can see how mmgcu drives the simulated torch_gcu.
counters: collections.Counter = collections.Counter()
#: Whether this process said that torch_gcu is simulated (its launchers tell their children).
notice_shown = False


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


def host_reads() -> int:
    """Reads of card values by the host in this process (scalar reads and copies to the CPU)."""
    reads = ext.host_reads()
    return int(reads["scalar_reads"] + reads["copies_to_host"])
