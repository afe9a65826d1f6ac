"""``mmgcu env``: everything a bug report needs about this machine, in one paste.

Modelled on ``accelerate env`` and mmengine's ``collect_env``: the versions of the stack,
what mmgcu's device layer found (generation, cards, ECCL, process-group backend) and the
environment variables that change which cards and collectives a run gets. It never
imports torch_gcu itself: the device layer does, and says why when it cannot. A simulated
torch_gcu (``MMGCU_SIMULATE``) is reported first, so nobody mistakes it for hardware.
"""

import glob
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
from collections import OrderedDict
from typing import Any, Callable, Dict

ECCL_PREFIXES = ("ECCL_", "TORCH_ECCL_")
ECCL_MISSING = "ECCL is not available: "  # how the backends' GCUError starts
#: Where TopsRider installs; only files found there are reported, nothing is assumed.
TOPSRIDER_ROOT = "/usr/local/topsrider"


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "env",
        help="report the software stack, the GCU cards and the ECCL set-up",
        description="Print versions, GCU cards and the ECCL set-up, to paste into an issue.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.set_defaults(func=run)


def run(args) -> int:
    info = collect_env()
    print(json.dumps(info, indent=2) if args.json else format_env(info))
    return 0


def _safe(fn: Callable[[], Any]) -> Any:
    """``fn()``, or what went wrong: a report must not die on the fault it should show."""
    try:
        return fn()
    except Exception as e:
        return f"failed: {type(e).__name__}: {e}"


def _version(module: str) -> str:
    try:
        return str(getattr(importlib.import_module(module), "__version__", "unknown"))
    except ImportError as e:
        return f"not installed ({e})"


def _mmcv_ops() -> str:
    try:
        importlib.import_module("mmcv._ext")
    except ImportError as e:
        return f"no: mmcv._ext does not import ({e}); rebuild mmcv with MMCV_WITH_OPS=1"
    return "yes (mmcv._ext)"


def topsrider_version() -> str:
    """``efsmi --version`` and TopsRider's version files, where present; else 'not found'."""
    found = []
    exe = shutil.which("efsmi")
    if exe:
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
            lines = [x.strip() for x in (out.stdout + out.stderr).splitlines() if x.strip()]
            found.append(f"efsmi --version: {' / '.join(lines[:3]) or 'no output'}")
        except (OSError, subprocess.TimeoutExpired) as e:
            found.append(f"efsmi --version failed: {e}")
    for path in sorted(glob.glob(os.path.join(TOPSRIDER_ROOT, "*version*"))):
        if os.path.isfile(path):
            with open(path, errors="replace") as f:
                first = (f.read(200).strip().splitlines() or ["(empty)"])[0]
            found.append(f"{path}: {first}")
    if found:
        return "; ".join(found)
    return f"not found (no efsmi on PATH, no {TOPSRIDER_ROOT}/*version* file)"


def _torch_gcu(accelerator) -> str:
    """The accelerator's description, or why torch_gcu was not found (the fallback says it)."""
    if accelerator.is_gcu:
        from .. import sim

        return ("SIMULATED " if sim.is_installed() else "") + accelerator.description
    base = type(accelerator).description
    why = accelerator.description
    if why.endswith("; " + base):
        why = why[: -len(base) - 2]
    return f"not found: {why}"


def _cards(accelerator) -> Dict[str, Any]:
    """Card count and names: from the device layer, else from the ``efsmi`` table."""
    from ..launch.cards import count_cards, efsmi_cards

    info = OrderedDict()  # type: Dict[str, Any]
    if accelerator.is_gcu:
        count = accelerator.device_count()
        info["cards"] = count
        names = OrderedDict()  # type: Dict[str, list]
        for i in range(count):
            name = str(_safe(lambda i=i: accelerator.device_name(i)))
            names.setdefault(name, []).append(str(i))
        for name, ids in names.items():
            info[f"GCU {','.join(ids)}"] = name
    else:
        listed = efsmi_cards()
        if listed:
            info["cards"] = f"{len(listed)} listed by efsmi, but torch_gcu cannot use them"
            info["efsmi cards"] = ", ".join(f"{i}: {n}" for i, n in listed)
        else:
            info["cards"] = (
                f"0 GCU cards (no torch_gcu; efsmi absent or lists none); {accelerator.kind}"
            )
    count, source = count_cards()
    info["cards for launchers"] = f"{count} ({source})"
    return info


def _dist(accelerator) -> Dict[str, Any]:
    from ..errors import GCUError

    info = OrderedDict()  # type: Dict[str, Any]
    if not accelerator.is_gcu:
        info["ECCL"] = f"not applicable: no GCU ({accelerator.kind})"
    else:
        try:
            accelerator.check_collectives()
            info["ECCL"] = "available"
        except GCUError as e:
            why = str(e)
            if why.startswith(ECCL_MISSING):
                why = why[len(ECCL_MISSING) :]
            info["ECCL"] = f"NOT available: {why}"
    info["process groups"] = accelerator.summary()["process_groups"]
    eccl = OrderedDict(
        (k, os.environ[k]) for k in sorted(os.environ) if k.startswith(ECCL_PREFIXES)
    )
    info["ECCL variables"] = eccl or "none set"
    return info


def collect_env() -> Dict[str, Any]:
    """The report, as an ordered dict of plain values (str, int, dict)."""
    import torch

    import mmgcu

    from .. import sim
    from ..device import select_accelerator

    info = OrderedDict()  # type: Dict[str, Any]
    if sim.is_installed():
        info["torch_gcu simulator"] = (
            f"SIMULATED ({sim.state.hardware}: {sim.state.api} API, {sim.state.cards} cards): "
            "torch_gcu is mmgcu.sim on host memory, not Enflame hardware"
        )
    info["mmgcu"] = f"{mmgcu.__version__} ({os.path.dirname(mmgcu.__file__)})"
    info["Python"] = sys.version.replace("\n", " ")
    info["Python executable"] = sys.executable
    info["platform"] = platform.platform()
    info["torch"] = torch.__version__
    info["torch CUDA build"] = torch.version.cuda or "no (CPU build)"
    accelerator = _safe(select_accelerator)
    if isinstance(accelerator, str):  # detection itself failed: report that and the rest
        info["torch_gcu"] = accelerator
    else:
        info["torch_gcu"] = _safe(lambda: _torch_gcu(accelerator))
    info["TopsRider / driver"] = _safe(topsrider_version)
    info.update(_openmmlab())
    if not isinstance(accelerator, str):
        fallback = "" if accelerator.is_gcu else " (fallback)"
        info["device"] = f"{accelerator.kind}{fallback}: {accelerator.description}"
        cards = _safe(lambda: _cards(accelerator))
        info.update(cards if isinstance(cards, dict) else {"cards": cards})
    info.update(_visible_vars())
    if not isinstance(accelerator, str):
        dist = _safe(lambda: _dist(accelerator))
        info.update(dist if isinstance(dist, dict) else {"ECCL": dist})
    return info


def _openmmlab() -> Dict[str, str]:
    return OrderedDict(
        [
            ("mmengine", _version("mmengine")),
            ("mmcv", _version("mmcv")),
            ("mmcv ops compiled", _mmcv_ops()),
            ("mmseg", _version("mmseg")),
        ]
    )


def _visible_vars() -> Dict[str, str]:
    """Each visible-devices variable as set ('set but empty' hides every card)."""
    from ..launch.cards import VISIBLE_VARS

    shown = {}
    for name in (*VISIBLE_VARS, "CUDA_VISIBLE_DEVICES"):
        value = os.environ.get(name)
        shown[name] = "unset" if value is None else value
        if value is not None and not value.strip(" ,"):
            shown[name] = "set but empty (no card is visible)"
    return shown


def format_env(info: Dict[str, Any]) -> str:
    """``- key: value`` lines, values aligned, like mmengine's collect_env printout."""
    width = max(len(k) for k in info) + 1
    lines = []
    for key, value in info.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        lines.append(f"- {key + ':':<{width}} {value}")
    return "\n".join(lines)
