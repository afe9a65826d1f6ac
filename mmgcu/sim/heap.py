"""The host heap of a process on simulated cards: it keeps what it frees, as a card does.

Simulated card memory is host memory from glibc's ``malloc``. By default glibc maps each
block over its mmap threshold (128 KB, rising to 32 MB) on its own and unmaps it when it
is freed, so every step's large tensors would be faulted in and zeroed again, page by page
(a 2-card LRASPP rehearsal on 2026-11-27: 20 million page faults and 67 s of system time in
92 s; docs/simulator.md). torch_gcu 2.x keeps what it frees for the next step (a caching
allocator: ``torch.gcu.empty_cache``, ``memory_stats``); the 1.x source shows no allocator
beyond ``get_hbm_alloc_size``, so there this is only the simulator's speed. Card memory is
counted per card all the same (``csrc/gcu_sim.cpp``): peaks and the out-of-memory check do
not change.

Set by the simulator's install in each process (so a user's own ``torchrun``, ``mmgcu
check`` and the tests' jobs get it too), with ``mallopt(3)``: one heap for the threads
that allocate from then on, no block mapped on its own, never trimmed. A user who set any
of glibc's heap settings (``MALLOC_*``, ``GLIBC_TUNABLES=glibc.malloc.*``) gets none of
these: setting one of them through ``mallopt`` also fixes glibc's mmap threshold, which
would change what the user chose.
"""

import ctypes
import os
import sys
from typing import List

# mallopt(3) parameters (malloc.h), with the environment names glibc reads them from.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_NEVER = -1  # mallopt(3): "Setting M_TRIM_THRESHOLD to -1 disables trimming completely"
#: (mallopt parameter, environment variable, value)
SETTINGS = (
    (_M_ARENA_MAX, "MALLOC_ARENA_MAX", 1),
    (_M_MMAP_MAX, "MALLOC_MMAP_MAX_", 0),
    (_M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", _NEVER),
)


def users_settings(env=None) -> List[str]:
    """glibc's heap settings the user made in ``env``: ``MALLOC_*`` variables and
    ``glibc.malloc.*`` tunables."""
    env = os.environ if env is None else env
    named = sorted(name for name in env if name.startswith("MALLOC_"))
    tunables = env.get("GLIBC_TUNABLES", "").split(":")
    return named + [t.split("=")[0] for t in tunables if t.startswith("glibc.malloc.")]


def keep_freed_memory() -> List[str]:
    """Apply the settings unless the user made heap settings of their own; return the
    environment names of those applied. Nothing where the C library is not glibc
    (``mallopt`` missing, or refusing as musl's does)."""
    if not sys.platform.startswith("linux") or users_settings():
        return []
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return []
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return [name for param, name, value in SETTINGS if mallopt(param, value) == 1]
