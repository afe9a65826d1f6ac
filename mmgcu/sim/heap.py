"""The host heap of a process on simulated cards: it keeps what it frees, as a card does.

Simulated card memory is host memory from glibc's ``malloc``. By default glibc maps each
block over its mmap threshold (128 KB, rising to 32 MB) on its own and unmaps it when it
is freed, so every step's large tensors were faulted in and zeroed again, page by page (a
2-card LRASPP rehearsal: 20 million page faults and 67 s of system time in 92 s). torch_gcu
2.x keeps what it frees for the next step (a caching allocator: ``torch.gcu.empty_cache``,
``memory_stats``); the 1.x source shows no allocator beyond ``get_hbm_alloc_size``, so
there this is only the simulator's speed. Card memory is still counted per card
(``csrc/gcu_sim.cpp``): peaks and the out-of-memory check do not change.

Set by the simulator's install in each process (so a user's own ``torchrun``, ``mmgcu
check`` and the tests' jobs get it too), with ``mallopt(3)``: one heap, no block mapped
on its own, never trimmed below 2 GiB of free top. A setting the user made through
glibc's environment (``MALLOC_ARENA_MAX``, ``GLIBC_TUNABLES=glibc.malloc.arena_max=...``)
is left as glibc read it.
"""

import ctypes
import os
import sys
from typing import List

# mallopt(3) parameters (malloc.h), with the environment names glibc reads them from.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_INT_MAX = 2**31 - 1  # mallopt takes an int: the largest trim threshold it can set
#: (mallopt parameter, environment variable, glibc tunable, value)
SETTINGS = (
    (_M_ARENA_MAX, "MALLOC_ARENA_MAX", "glibc.malloc.arena_max", 1),
    (_M_MMAP_MAX, "MALLOC_MMAP_MAX_", "glibc.malloc.mmap_max", 0),
    (_M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold", _INT_MAX),
)


def users_settings(env=None) -> List[str]:
    """The environment names of the heap settings the user made in ``env``."""
    env = os.environ if env is None else env
    tunables = env.get("GLIBC_TUNABLES", "")
    return [name for _, name, tunable, _ in SETTINGS if name in env or tunable + "=" in tunables]


def keep_freed_memory() -> List[str]:
    """Apply the settings the user did not make; return their environment names. Nothing
    where the C library is not glibc (``mallopt`` missing, or refusing as musl's does)."""
    if not sys.platform.startswith("linux"):
        return []
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return []
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    skip = users_settings()
    return [
        name
        for param, name, _, value in SETTINGS
        if name not in skip and mallopt(param, value) == 1
    ]
