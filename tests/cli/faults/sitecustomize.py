"""Faults for ``mmgcu check`` tests, injected into its workers from outside mmgcu.

On ``PYTHONPATH``, Python imports this at start-up in every process; it acts only in the
worker with ``LOCAL_RANK=1`` and only when ``MMGCU_TEST_FAULT`` names a fault:

- ``all_reduce``: that rank's ``torch.distributed.all_reduce`` results are off by one;
- ``hang``: that rank sleeps before doing anything, as a wedged card would;
- ``exit``: that rank dies at once, before it can report anything.
"""

import os

_FAULT = os.environ.get("MMGCU_TEST_FAULT") if os.environ.get("LOCAL_RANK") == "1" else None

if _FAULT == "hang":
    import time

    time.sleep(3600)
elif _FAULT == "all_reduce":
    import torch.distributed as _dist

    _real_all_reduce = _dist.all_reduce

    def _wrong_all_reduce(tensor, *args, **kwargs):
        work = _real_all_reduce(tensor, *args, **kwargs)
        tensor.add_(1)
        return work

    _dist.all_reduce = _wrong_all_reduce
elif _FAULT == "exit":
    os._exit(3)
