"""A simulated torch_gcu, so mmgcu can be proven without a T20.

Cards are a real PyTorch device type backed by host memory (``csrc/gcu_sim.cpp``), so
wrong device placement fails here as it does on hardware. Activated by ``MMGCU_SIMULATE=<cards>``
(and ``MMGCU_SIMULATE_API=v2|legacy``) before ``import mmgcu``; it fakes only torch_gcu.
"""

import logging
import os
import sys

from . import state

ENV_CARDS = "MMGCU_SIMULATE"
ENV_API = "MMGCU_SIMULATE_API"
# MMGCU_SIMULATE_ECCL=0 models a GCU host whose ECCL is missing (a broken install).
ENV_ECCL = "MMGCU_SIMULATE_ECCL"
APIS = ("v2", "legacy")

logger = logging.getLogger(__name__)


def requested() -> bool:
    """Whether this process was asked to simulate cards."""
    return bool(os.environ.get(ENV_CARDS))


def eccl_installed() -> bool:
    return os.environ.get(ENV_ECCL, "1") != "0"


def is_installed() -> bool:
    return state.api is not None


def visible_cards(installed: int) -> int:
    """Cards left visible by ``TOPS_VISIBLE_DEVICES`` (the T20's CUDA_VISIBLE_DEVICES)."""
    visible = os.environ.get("TOPS_VISIBLE_DEVICES")
    if visible is None:
        return installed
    ids = [v for v in visible.split(",") if v.strip()]
    return min(len(ids), installed)


def install(cards=None, api=None):
    """Install the simulated ``torch_gcu`` in this process (once) and return it."""
    if is_installed():
        return sys.modules["torch_gcu"]
    cards = int(cards if cards is not None else os.environ.get(ENV_CARDS, "0"))
    api = api or os.environ.get(ENV_API) or "v2"
    if api not in APIS:
        raise ValueError(f"{ENV_API}={api!r}: expected one of {', '.join(APIS)}")
    if cards < 1:
        raise ValueError(f"{ENV_CARDS}={cards}: simulate at least one card")

    from .build import load_extension

    state.ext = load_extension()
    state.cards = visible_cards(cards)
    state.ext.install(state.cards)
    if api == "v2":
        from . import v2 as flavour
    else:
        from . import legacy as flavour
    state.device_type = "gcu" if api == "v2" else "xla"
    module = flavour.build()
    state.api = api
    sys.modules["torch_gcu"] = module
    logger.warning(
        "mmgcu: torch_gcu is SIMULATED (%s API, %d cards on host memory); "
        "results prove device placement and distribution, not GCU speed or numerics",
        api,
        state.cards,
    )
    return module
