"""The simulated XLA card's lazy graph, seen from Python (the counting is ``csrc/lazy_graph.h``).

torch_gcu 1.x cards are XLA devices: an op records IR, and a graph runs when the host reads
a pending value, when an op without a lowering falls back to the CPU, and at the step; a
graph not seen before is compiled first. This module configures that model at install,
names the Python caller of a cut, and gives its counters as torch_gcu 1.x reports them
(``metrics_report()``: torch_xla 1.x's format) and as numbers for the rehearsal.

``MMGCU_SIM_XLA`` picks the lowering profile: ``t20`` (default, torch_xla 1.10, which
torch_gcu 1.x forks) or ``xla-cpu`` (torch_xla 2.9 on a CPU device, the conformance suite's
real runtime); ``off`` keeps no graph (``make bench`` measures what keeping it costs).
"""

import os
import os.path as osp
import sys
from typing import Dict, List

from . import state, xla_ops

PROFILE_ENV = "MMGCU_SIM_XLA"
PROFILES = ("t20", "xla-cpu", "off")
#: Compiled graphs kept (XLA_COMPILATION_CACHE_SIZE: 1024 in torch_xla 1.10, 2048 in 2.9).
CACHE_SIZE = {"t20": 1024, "xla-cpu": 2048, "off": 0}
_TORCH_DIR = osp.dirname(osp.dirname(osp.abspath(__import__("torch").__file__)))
_SKIP = (osp.join(_TORCH_DIR, "torch", ""), osp.join(osp.dirname(osp.abspath(__file__)), ""))


def profile() -> str:
    name = os.environ.get(PROFILE_ENV) or "t20"
    if name not in PROFILES:
        raise ValueError(f"{PROFILE_ENV}={name!r}: one of {', '.join(PROFILES)}")
    return name


def lowered(name: str) -> List[str]:
    """The ops a profile lowers, by base name."""
    # on torch 1.10 the card sees _cat where torch_xla (either version) lowers cat itself
    common = xla_ops.AUTOGRAD_BACKWARD | xla_ops.REACHED_THROUGH_LOWERED_1_10
    if name == "off":
        return []
    if name == "xla-cpu":
        return sorted(xla_ops.LOWERED_2_9 | xla_ops.COMPOSITE_2_9 | common)
    ops = xla_ops.LOWERED_1_10 | xla_ops.COMPOSITE_1_10 | xla_ops.NEW_IN_TORCH2_LOWERED
    return sorted(ops | common)


def configure(ext) -> None:
    """Give the native part its lowering table and the caller hook."""
    name = profile()
    ext.graph_configure(name, lowered(name), CACHE_SIZE[name])
    ext.graph_set_caller(caller)


def short_path(path: str) -> str:
    """A source file as a report names it: from the package folder on (no machine path)."""
    path = osp.abspath(path)  # Python 3.8 keeps a script's name as it was given
    for marker in ("site-packages", "dist-packages"):
        head, sep, tail = path.partition(osp.sep + marker + osp.sep)
        if sep:
            return tail
    cwd = osp.join(os.getcwd(), "")
    return path[len(cwd) :] if path.startswith(cwd) else osp.join(*path.split(osp.sep)[-3:])


def caller() -> str:
    """``file:line`` of the innermost Python frame outside torch and the simulator, or
    ``backward`` on autograd's thread (no Python frame there)."""
    frame = sys._getframe(0)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_SKIP) and not path.startswith("<"):
            return f"{short_path(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "backward"


def counters() -> Dict[str, int]:
    """Graph runs by cause (``runs.step``, ``runs.host_read``, ``runs.fallback``),
    ``UncachedCompile``, ``CachedCompile``, each ``aten::<op>`` that fell back, ``events``."""
    return dict(state.ext.graph_counters())


def graph_runs(counts: Dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k.startswith("runs."))


def events(start: int = 0) -> List[dict]:
    """Each graph run from index ``start``: its cause, what made it, the caller, whether it
    compiled, how many values it output."""
    keys = ("cause", "what", "caller", "compiled", "outputs")
    return [dict(zip(keys, e)) for e in state.ext.graph_events(start)]


def metrics_report() -> str:
    """The counters in torch_xla 1.x's ``metrics_report()`` format (torch_gcu 1.x's own
    format is not public: ASSUMED to be its parent's)."""
    counts = counters()
    runs = graph_runs(counts)
    lines = []
    for metric, samples in (("CompileTime", counts["UncachedCompile"]), ("ExecuteTime", runs)):
        lines += [f"Metric: {metric}", f"  TotalSamples: {samples}", "  Accumulator: 0ns"]
        lines.append("  Percentiles: ")
    fallbacks = [k for k in counts if k.startswith("aten::")]
    for name in sorted(["CachedCompile", "UncachedCompile"] + fallbacks):
        lines += [f"Counter: {name}", f"  Value: {counts[name]}"]
    return "\n".join(lines) + "\n"
