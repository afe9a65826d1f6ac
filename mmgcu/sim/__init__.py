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
#: The torch_gcu generations the simulator models, and the other names users type for them.
APIS = ("gcu2", "gcu1")
API_ALIASES = {"v2": "gcu2", "legacy": "gcu1"}

logger = logging.getLogger(__name__)


def requested() -> bool:
    """Whether this process was asked to simulate cards."""
    return bool(os.environ.get(ENV_CARDS))


def eccl_installed() -> bool:
    return os.environ.get(ENV_ECCL, "1") != "0"


def is_installed() -> bool:
    return state.api is not None


def visible_cards(installed: int) -> int:
    """Cards left visible by ``TOPS_VISIBLE_DEVICES`` (the T20's CUDA_VISIBLE_DEVICES), or
    in a Kubernetes container by ``ENFLAME_VISIBLE_DEVICES`` (the device plugin mounts only
    those cards); the first wins. Set but empty: no card, as the driver would show."""
    from ..device.cards import visible_devices  # reads only os.environ

    ids = visible_devices()
    return installed if ids is None else min(len(ids), installed)


def install(cards=None, api=None):
    """Install the simulated ``torch_gcu`` in this process (once) and return it."""
    if is_installed():
        return sys.modules["torch_gcu"]
    cards = int(cards if cards is not None else os.environ.get(ENV_CARDS, "0"))
    given = api or os.environ.get(ENV_API) or "gcu2"
    api = API_ALIASES.get(given, given)
    if api not in APIS:
        raise ValueError(
            f"{ENV_API}={given!r}: expected one of {', '.join(APIS + tuple(API_ALIASES))}"
        )
    if cards < 1:
        raise ValueError(f"{ENV_CARDS}={cards}: simulate at least one card")

    from .build import load_extension

    state.ext = load_extension()
    state.cards = visible_cards(cards)
    state.ext.install(max(state.cards, 1))  # no visible card: the host has cards, none shown
    state.device_type = "gcu" if api == "gcu2" else "xla"
    state.api = api
    module = _install_gcu2() if api == "gcu2" else _install_gcu1()
    logger.warning(
        "mmgcu: torch_gcu is SIMULATED (%s API, %d cards on host memory); "
        "results prove device placement and distribution, not GCU speed or numerics",
        api,
        state.cards,
    )
    return module


def _install_gcu2():
    from . import v2

    module = v2.build()
    sys.modules["torch_gcu"] = module
    return module


def _install_gcu1():
    """Register the package ``torch_gcu1`` as ``torch_gcu`` and each of its modules."""
    import importlib
    import pkgutil

    from . import torch_gcu1

    for info in pkgutil.walk_packages(torch_gcu1.__path__, torch_gcu1.__name__ + "."):
        module = importlib.import_module(info.name)
        sys.modules["torch_gcu" + info.name[len(torch_gcu1.__name__) :]] = module
    sys.modules["torch_gcu"] = torch_gcu1
    return torch_gcu1
