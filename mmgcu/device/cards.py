"""The cards a process sees, as the device layer and the simulator read them.

The launchers count cards before any process imports torch, and ``tools/dist_*.sh`` run
without the mmgcu package, so the counting lives in :mod:`mmgcu.launch.cards` (standard
library only); these are the names the device layer and the simulator take from it.
"""

from ..launch.cards import (
    GENERATION_ALIASES,
    HARDWARE,
    SIMULATE_ENV,
    VISIBLE_ENV,
    VISIBLE_VARS,
    count_cards,
    describe_visible,
    efsmi_cards,
    parse_efsmi,
    parse_simulate,
    physical_card,
    simulated_cards,
    visible_devices,
)

__all__ = [
    "GENERATION_ALIASES",
    "HARDWARE",
    "SIMULATE_ENV",
    "VISIBLE_ENV",
    "VISIBLE_VARS",
    "count_cards",
    "describe_visible",
    "efsmi_cards",
    "parse_efsmi",
    "parse_simulate",
    "physical_card",
    "simulated_cards",
    "visible_devices",
]
