"""Page faults of six rounds of taking a 64 MB block from the C heap, writing it and
freeing it (the way card memory is host memory under the simulator), after the
simulator's install when ``MMGCU_SIMULATE`` is set. Prints one JSON line."""

import ctypes
import json
import resource

import sim_alone  # noqa: F401

import mmgcu.sim

if mmgcu.sim.requested():
    mmgcu.sim.install()

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(64 << 20)
    ctypes.memset(block, 1, 64 << 20)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
