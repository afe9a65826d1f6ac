"""A simulated torch_gcu, so mmgcu can be proven without a T20.

Cards are a real PyTorch device type backed by host memory (``csrc/gcu_sim.cpp``), so
wrong device placement fails here as it does on hardware. Activated before ``import mmgcu``
by ``MMGCU_SIMULATE``: ``t20`` (a T20 server: 8 cards, torch_gcu 1.x), ``t20:4``, ``s60:8``
(torch_gcu 2.x), or a card count alone, which simulates this torch's generation (2.x on
torch 2, 1.x on torch 1.10). ``MMGCU_SIMULATE_API=gcu2|gcu1`` (aliases ``v2|legacy``) names
the generation instead of the hardware. It fakes only torch_gcu.
"""

import atexit
import logging
import os
import sys

from ..device.cards import GENERATION_ALIASES
from . import state

ENV_CARDS = "MMGCU_SIMULATE"
ENV_API = "MMGCU_SIMULATE_API"
# MMGCU_SIMULATE_ECCL=0 models a GCU host whose ECCL is missing (a broken install).
ENV_ECCL = "MMGCU_SIMULATE_ECCL"
# Given by a launcher whose process said so to the processes it starts (the ranks of
# `mmgcu train`, of `mmgcu check`), so that they do not say it again (see child_env).
ENV_NOTICE = "MMGCU_SIMULATE_NOTICE"
#: Where launchers put the global rank before any process group exists.
RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "LOCAL_RANK")
#: The torch_gcu generations the simulator models, and the other names users type for them.
APIS = ("gcu2", "gcu1")
API_ALIASES = GENERATION_ALIASES

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
    from ..device.cards import visible_devices

    ids = visible_devices()
    return installed if ids is None else min(len(ids), installed)


def default_api() -> str:
    """torch_gcu 2.x needs torch 2.x; on the T20 stack's torch 1.10 only 1.x exists."""
    import torch

    return "gcu1" if torch.__version__.startswith("1.") else "gcu2"


def _release_autograd_threads() -> None:
    # The autograd thread of a simulated card can still hold its last backward task when
    # the interpreter exits; freeing it needs the GIL, and a thread that cannot take it
    # during finalisation aborts the process ("terminate called without an active
    # exception"). Waiting a moment here, while Python is whole, lets it finish.
    import time

    time.sleep(0.05)


def install(cards=None, api=None):
    """Install the simulated ``torch_gcu`` in this process (once) and return it."""
    if is_installed():
        return sys.modules["torch_gcu"]
    from ..device.cards import HARDWARE, parse_simulate  # reads only os.environ

    hardware, count = parse_simulate(os.environ.get(ENV_CARDS) or "0")
    cards = int(cards if cards is not None else count)
    api = resolve_api(api or os.environ.get(ENV_API), hardware)
    if cards < 1:
        raise ValueError(f"{ENV_CARDS}={cards}: simulate at least one card")

    from .build import load_extension
    from .heap import keep_freed_memory

    keep_freed_memory()
    state.ext = load_extension()
    state.cards = visible_cards(cards)
    state.ext.install(max(state.cards, 1))  # no visible card: the host has cards, none shown
    from . import graph

    graph.configure(state.ext)
    state.device_type = "gcu" if api == "gcu2" else "xla"
    state.api = api
    # The hardware that runs this generation (T20 or S60), also when MMGCU_SIMULATE names none.
    state.hardware = next(name.upper() for name, (gen, _) in HARDWARE.items() if gen == api)
    atexit.register(_release_autograd_threads)
    module = _install_gcu2() if api == "gcu2" else _install_gcu1()
    if _says_it():
        state.notice_shown = True
        logger.warning(
            "mmgcu: torch_gcu is SIMULATED (%s: the torch_gcu %s API, %s:N; %d cards on host "
            "memory); results prove device placement and distribution, not GCU speed or "
            "numerics",
            state.hardware,
            "1.x" if api == "gcu1" else "2.x",
            state.device_type,
            state.cards,
        )
    return module


def child_env(env: dict) -> dict:
    """``env`` for a process this one starts: told that the notice was shown, when this
    process showed it (one notice per job, not one per rank)."""
    env = dict(env)
    if state.notice_shown or os.environ.get(ENV_NOTICE) == "shown":
        env[ENV_NOTICE] = "shown"
    return env


def resolve_api(given, hardware) -> str:
    """The generation to simulate: ``MMGCU_SIMULATE_API`` (or ``api=``), else the one the
    hardware runs, else this torch's."""
    from ..device.cards import HARDWARE

    implied = HARDWARE[hardware][0] if hardware else None
    if not given:
        return implied or default_api()
    api = API_ALIASES.get(given, given)
    if api not in APIS:
        raise ValueError(
            f"{ENV_API}={given!r}: expected one of {', '.join(APIS + tuple(API_ALIASES))}"
        )
    if implied and implied != api:
        raise ValueError(
            f"{ENV_CARDS}={os.environ.get(ENV_CARDS)} simulates {hardware.upper()} cards (the "
            f"{implied} API) but {ENV_API}={given}: leave {ENV_API} out, or name the other "
            "hardware"
        )
    return api


def _says_it() -> bool:
    """Whether this process tells that torch_gcu is simulated: once per job, by the first
    process (a launcher that imported mmgcu, else rank 0), not once per rank."""
    if os.environ.get(ENV_NOTICE) == "shown":
        return False
    for name in RANK_VARS:
        if os.environ.get(name) is not None:
            return os.environ[name] == "0"
    return True


def _install_gcu2():
    from . import torch_gcu2

    torch_gcu2.install()
    return _register(torch_gcu2)


def _install_gcu1():
    from . import missing_kernels, torch_gcu1

    missing_kernels.register("XLA")
    return _register(torch_gcu1)


def _register(package):
    """Make ``package`` importable as ``torch_gcu`` and each module of it as
    ``torch_gcu.<module>``, as the real package is."""
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        sys.modules["torch_gcu" + info.name[len(package.__name__) :]] = module
    sys.modules["torch_gcu"] = package
    return package
