"""This host's memory in a rehearsal: what the simulated cards take of it, and a verdict
that tells a rank the host's kernel killed from a card that cannot hold the job.

Simulated cards are host memory. The simulator's heap keeps what it frees, for speed
(:mod:`mmgcu.sim.heap`), so a rank holds the most it ever held: at ``--scale real`` the
resume job loaded its checkpoint into host memory (the checkpoint, then the optimizer's
copy of its state) and kept those pages through its step; with the config's crops a
step's own freed blocks stay too. At real scale the ranks therefore take glibc's own
setting instead (:func:`heap_env`): a block of :data:`OWN_MAPPING` or more is mapped on
its own and given back when freed, so a rank holds what its card holds now, plus its
libraries. Card memory is counted per card either way: the peaks do not change.
"""

import re
from typing import Dict, List, Optional

from ..sim.heap import users_settings
from .memory import MemoryFigure
from .phases import FAILED, NOT_RUN, PASSED
from .plan import DEFAULT_HARDWARE
from .report import Report

#: At real scale, host blocks of this size or more are mapped on their own (glibc's
#: ``MALLOC_MMAP_THRESHOLD_``) and given back when freed.
OWN_MAPPING = 1 << 20
GIB = 1 << 30
#: Host memory a rank takes beyond its card's (its libraries, Python): about what a
#: rank of a ViT-L rehearsal held over its card's bytes (0.9 GiB, measured).
LIBRARIES = 1 << 30
#: What :func:`mmgcu.rehearsal.logs.first_error` says of a rank killed with no traceback.
_KILLED = re.compile(r"SIGKILL|exitcode\s*:\s*-9\b")


def heap_env(scale: str, env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The ranks' glibc heap setting at ``scale``: none at the small scale (the simulator's
    own, for speed), :data:`OWN_MAPPING` at real scale; none where the user made a heap
    setting of their own (``MALLOC_*``, ``GLIBC_TUNABLES``), which the ranks keep."""
    if scale != "real" or users_settings(env):
        return {}
    return {"MALLOC_MMAP_THRESHOLD_": str(OWN_MAPPING)}


def host_killed(report: Report) -> bool:
    """Whether the rehearsal stopped on a rank that was killed (SIGKILL, no traceback):
    the host's out-of-memory killer, on a host whose memory the simulated cards share."""
    return report.error is not None and bool(_KILLED.search(report.error.message or ""))


def available_bytes() -> Optional[int]:
    """This host's available memory now (``MemAvailable``), or None where it is unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def rank_bytes(facts: Optional[dict]) -> Optional[int]:
    """What one rank of the small scale holds at least: its weights, gradients and
    optimizer state (measured after the first step, else AdamW's two moments of each
    gradient), and :data:`LIBRARIES` of host memory; None without the model's sizes."""
    if not facts or not facts.get("weights_bytes"):
        return None
    grads = sum((facts.get("gradients") or {}).values())
    state = (facts.get("first") or {}).get("state_bytes")
    return facts["weights_bytes"] + grads + (2 * grads if state is None else state) + LIBRARIES


def finish_ranks(report: Report, facts: Optional[dict]) -> int:
    """The ranks of a small-scale rehearsal this host holds: the world (or half the ranks
    that were killed) at most, as many as :func:`rank_bytes` fit in what the host had
    available when the rehearsal started, one at least."""
    world = int(report.world or report.cards or 1)
    most = world if report.scale == "real" else max(1, int(report.cards) // 2)
    each, available = rank_bytes(facts), report.host_available
    if each and available:
        most = min(most, available // each)
    return max(1, int(most))


def finish_command(report: Report, facts: Optional[dict]) -> str:
    """The command that proves on this host the phases the killed rank did not: the small
    scale (the paths, on as many ranks as this host holds), on the report's hardware where
    it is not the default one."""
    hardware = report.hardware.lower()
    option = "" if hardware == DEFAULT_HARDWARE else f" --hardware {hardware}"
    return f"mmgcu rehearse {report.config} --cards {finish_ranks(report, facts)}{option}"


def _figure_line(report: Report, memory: Optional[MemoryFigure]) -> str:
    """What the killed rehearsal says of the per-card figure."""
    if memory is not None:
        verdict = "fits" if memory.fits else "DOES NOT FIT"
        return (
            f"  proven: per card for {memory.world} rank(s), "
            f"{memory.total_bytes / GIB:.2f} GiB of "
            f"{memory.card_memory_bytes / GIB:.2f} GiB: {verdict}"
        )
    if report.scale == "real":
        return (
            "  not proven: the per-card figure: the rank was killed before its first "
            "iteration ended, so this host holds less than one card's step; measure it on a "
            f"host with more free memory (mmgcu rehearse {report.config} --scale real)"
        )
    return "  not proven: the per-card figure (--scale real measures it, on one rank)"


def verdict_lines(report: Report) -> Optional[List[str]]:
    """The verdict of a rehearsal whose rank the host killed (what was proven: the phases
    passed, the per-card figure; what was not; the command that finishes the proof on this
    host), or of one whose card does not hold the job; None for any other."""
    memory = report.memory
    if host_killed(report):
        return _killed_lines(report, memory)
    if memory is not None and not memory.fits:
        return [
            f"  verdict: DOES NOT FIT A {report.hardware} CARD: "
            f"{memory.total_bytes / GIB:.2f} GiB per card for {memory.world} rank(s) "
            f"against {memory.card_memory_bytes / GIB:.2f} GiB (the figure above): make "
            "the step smaller (images per card, crop, AMP) before the T20 sees this config"
        ]
    return None


def _killed_lines(report: Report, memory: Optional[MemoryFigure]) -> List[str]:
    proven = [p.name for p in report.phases if p.status == PASSED]
    missing = [p.name for p in report.phases if p.status in (FAILED, NOT_RUN)]
    return [
        f"  verdict: NOT PROVEN ON THIS HOST: a rank was killed for this host's memory in "
        f"{missing[0] if missing else 'the end'} (simulated cards are host memory); this "
        f"says nothing of the {report.hardware}'s card",
        f"  proven: {', '.join(proven) or 'nothing'}",
        _figure_line(report, memory),
        f"  not proven: {', '.join(missing) or '-'}",
        f"  finish on this host: {report.finish or finish_command(report, None)}",
    ]
