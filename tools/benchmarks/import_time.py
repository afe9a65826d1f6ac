"""Child of bench.py: how long ``import mmgcu`` takes in this fresh interpreter.

Timed with ``time.perf_counter`` around each import, in the order mmgcu itself needs them:
torch, then the mmengine modules mmgcu uses, then mmgcu (with ``MMGCU_SIMULATE`` set, this
is where the simulator's C++ part is loaded, or compiled on a first run). The sum is the
time of ``import mmgcu`` in a fresh interpreter. Prints one JSON line, with the file mmgcu
was imported from (so the bench can check which checkout a child runs).
"""

import importlib
import json
import sys
import time

MMENGINE = ("mmengine.registry", "mmengine.dist", "mmengine.model", "mmengine.optim")


def main() -> None:
    t0 = time.perf_counter()
    torch = importlib.import_module("torch")
    t1 = time.perf_counter()
    for name in MMENGINE + ("mmengine.runner", "mmengine.hooks"):
        importlib.import_module(name)
    t2 = time.perf_counter()
    mmgcu = importlib.import_module("mmgcu")
    t3 = time.perf_counter()
    print(
        json.dumps(
            dict(
                torch_s=t1 - t0,
                mmengine_s=t2 - t1,
                mmgcu_s=t3 - t2,
                total_s=t3 - t0,
                simulated=bool(mmgcu.sim.is_installed()),
                mmgcu_file=mmgcu.__file__,
                torch_version=torch.__version__,
                python=sys.version.split()[0],
            )
        )
    )


if __name__ == "__main__":
    main()
