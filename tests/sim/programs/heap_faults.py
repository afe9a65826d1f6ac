"""Six rounds of taking a 64 MB block from the C heap, writing it and freeing it (the way
card memory is host memory under the simulator), after the simulator's install when
``MMGCU_SIMULATE`` is set. Prints one JSON line: per round, whether glibc mapped the block
on its own (``mallinfo``'s count of mapped blocks, while it lives) and its page faults."""

import ctypes
import json
import resource

import sim_alone  # noqa: F401

import mmgcu.sim

if mmgcu.sim.requested():
    mmgcu.sim.install()


class MallInfo(ctypes.Structure):  # struct mallinfo (malloc.h): ten ints
    _fields_ = [
        (name, ctypes.c_int)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks")
        + ("uordblks", "fordblks", "keepcost")
    ]


libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
libc.mallinfo.restype = MallInfo
mapped, faults = [], []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = libc.mallinfo().hblks
    block = libc.malloc(64 << 20)
    mapped.append(libc.mallinfo().hblks - blocks)
    ctypes.memset(block, 1, 64 << 20)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(dict(mapped=mapped, faults=faults)))
