"""Counting cards from a launcher, without importing torch_gcu or touching a card.

Used by ``tools/dist_train.sh`` and ``mmgcu env``: the order is ``TOPS_VISIBLE_DEVICES``,
then the simulator's card count, then the rows of ``efsmi``.
"""

import os
import re
import shutil
import subprocess
from typing import List, Optional, Tuple

VISIBLE_ENV = "TOPS_VISIBLE_DEVICES"

# One card per row: '* 0      T20   | 10.19.3 | ...' (classic) or '| 0  T20  | ...' (newer).
_EFSMI_ROW = re.compile(r"^\s*[*|]\s*(\d+)\s+([A-Za-z][\w-]*)\s*\|")


def visible_devices() -> Optional[List[str]]:
    """The ids in ``TOPS_VISIBLE_DEVICES``, or None when it is not set."""
    value = os.environ.get(VISIBLE_ENV)
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def physical_card(index: int) -> str:
    """The node-wide id of visible card ``index`` (``TOPS_VISIBLE_DEVICES`` remaps them)."""
    visible = visible_devices()
    if visible is not None and 0 <= index < len(visible):
        return visible[index]
    return str(index)


def parse_efsmi(text: str) -> List[Tuple[int, str]]:
    """The (index, name) of each card in an ``efsmi`` table."""
    cards = {}
    for line in text.splitlines():
        m = _EFSMI_ROW.match(line)
        if m:
            cards.setdefault(int(m.group(1)), m.group(2))
    return sorted(cards.items())


def efsmi_cards(timeout: float = 10.0) -> Optional[List[Tuple[int, str]]]:
    """The cards ``efsmi`` lists, or None when it is missing or fails."""
    exe = shutil.which("efsmi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_efsmi(out.stdout) if out.returncode == 0 else None


def count_cards() -> Tuple[int, str]:
    """How many cards this node offers, and where the number came from."""
    visible = visible_devices()
    simulated = os.environ.get("MMGCU_SIMULATE", "")
    simulated = simulated if simulated.isdigit() else None
    if visible is not None:
        count = len(visible)
        if simulated:
            count = min(count, int(simulated))
        return count, f"{VISIBLE_ENV}={os.environ[VISIBLE_ENV]}"
    if simulated:
        return int(simulated), f"MMGCU_SIMULATE={simulated} (simulated cards)"
    cards = efsmi_cards()
    if cards:
        return len(cards), "efsmi"
    return 0, "no TOPS_VISIBLE_DEVICES, no simulator, no efsmi"


def main() -> None:
    """Print the card count (``python -m mmgcu.device.cards``), for shell launchers."""
    print(count_cards()[0])


if __name__ == "__main__":
    main()
