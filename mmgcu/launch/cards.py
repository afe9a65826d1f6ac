"""Counting cards from a launcher, without importing torch_gcu or touching a card.

Used by ``mmgcu train``/``test`` (``tools/dist_*.sh``), ``mmgcu env`` and the device layer
(:mod:`mmgcu.device.cards`): the order is the visible-devices variable, then the
simulator's card count, then the rows of ``efsmi``.

Two variables say which cards a process sees: ``TOPS_VISIBLE_DEVICES`` (TopsRider's own,
like ``CUDA_VISIBLE_DEVICES``) and ``ENFLAME_VISIBLE_DEVICES`` (set by Enflame's Kubernetes
device plugin for the cards of a container). When both are set, ``TOPS_VISIBLE_DEVICES``
wins: it is what a user sets inside the container to narrow the plugin's cards. Set but
empty means no card is visible, as for CUDA.
"""

import os
import re
import shutil
import subprocess
import sys
from typing import List, Optional, Tuple

VISIBLE_ENV = "TOPS_VISIBLE_DEVICES"
#: The variables naming the visible cards, the one that wins first.
VISIBLE_VARS = (VISIBLE_ENV, "ENFLAME_VISIBLE_DEVICES")
#: Simulated cards (``mmgcu.sim``): a count, or the hardware and its cards (see below).
SIMULATE_ENV = "MMGCU_SIMULATE"
#: The hardware the simulator stands in for: the torch_gcu generation its TopsRider
#: release runs, and the cards of one server. The T20 runs torch_gcu 1.x (TopsRider 2.x);
#: torch_gcu 2.x is the S60's (TopsRider 3.x).
HARDWARE = {"t20": ("gcu1", 8), "s60": ("gcu2", 8)}
#: Other names users type for the two torch_gcu generations (``env_cfg.device``,
#: ``mmgcu check --device``, ``MMGCU_SIMULATE_API``).
GENERATION_ALIASES = {"v2": "gcu2", "legacy": "gcu1"}
#: What messages call each torch_gcu generation.
GENERATION_NAMES = {"gcu1": "torch_gcu 1.x", "gcu2": "torch_gcu 2.x"}

# One card per row: '* 0      T20   | 10.19.3 | ...' (classic) or '| 0  T20  | ...' (newer).
_EFSMI_ROW = re.compile(r"^\s*[*|]\s*(\d+)\s+([A-Za-z][\w-]*)\s*\|")


def visible_setting() -> Optional[Tuple[str, str]]:
    """``(name, value)`` of the variable that decides the visible cards, or None."""
    for name in VISIBLE_VARS:
        value = os.environ.get(name)
        if value is not None:
            return name, value
    return None


def visible_devices() -> Optional[List[str]]:
    """The ids the visible-devices variable lists, or None when neither is set."""
    setting = visible_setting()
    if setting is None:
        return None
    return [v.strip() for v in setting[1].split(",") if v.strip()]


def describe_visible() -> str:
    """How the visible-devices variables stand, for messages: ``'TOPS_VISIBLE_DEVICES=0,1'``,
    ``'TOPS_VISIBLE_DEVICES is set but empty (no card is visible)'`` or ``'... unset'``."""
    setting = visible_setting()
    if setting is None:
        return f"{' and '.join(VISIBLE_VARS)} are unset"
    name, value = setting
    text = f"{name}={value}"
    if not value.strip(" ,"):
        text = f"{name} is set but empty (no card is visible)"
    ignored = [n for n in VISIBLE_VARS if n != name and n in os.environ]
    if ignored:
        text += f"; {ignored[0]}={os.environ[ignored[0]]} is ignored ({name} wins)"
    return text


def physical_card(index: int) -> str:
    """The node-wide id of visible card ``index`` (the visible-devices variable remaps them)."""
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


def parse_simulate(value: str) -> Tuple[Optional[str], int]:
    """The hardware (None: the generation of this torch) and the card count that
    ``MMGCU_SIMULATE`` names: ``8``, ``t20`` (a T20 server's 8 cards), ``t20:4``, ``s60:8``."""
    hardware, sep, count = value.strip().lower().rpartition(":")
    if not sep and count in HARDWARE:  # 't20': the whole server
        hardware, count = count, str(HARDWARE[count][1])
    if (hardware and hardware not in HARDWARE) or not count.isdigit():
        raise ValueError(
            f"{SIMULATE_ENV}={value!r}: give a card count (8), or the hardware and its "
            f"cards: {', '.join(HARDWARE)} (a whole server), or e.g. t20:4"
        )
    return hardware or None, int(count)


def simulated_cards() -> int:
    """The card count ``MMGCU_SIMULATE`` asks for (0 when unset)."""
    value = os.environ.get(SIMULATE_ENV, "")
    return parse_simulate(value)[1] if value else 0


def count_cards() -> Tuple[int, str]:
    """How many cards this node offers, and where the number came from."""
    visible = visible_devices()
    simulated = simulated_cards()
    if visible is not None:
        count = len(visible)
        if simulated:
            count = min(count, simulated)
        return count, describe_visible()
    if simulated:
        return simulated, f"{SIMULATE_ENV}={os.environ[SIMULATE_ENV]} (simulated cards)"
    cards = efsmi_cards()
    if cards:
        return len(cards), "efsmi"
    return 0, f"{describe_visible()}, no simulator, and efsmi is missing or lists no card"


def main() -> None:
    """Print the card count (``python mmgcu/launch/cards.py``), for shell launchers; with
    ``--why``, where it came from."""
    count, why = count_cards()
    print(why if sys.argv[1:] == ["--why"] else count)


if __name__ == "__main__":
    main()
