"""Holds a lock file until killed, for tests/runtime/test_locks.py: ``python lock_holder.py PATH``.

Prints the holder ``try_lock`` found (``null``: it got the lock), then sleeps.
"""

import json
import os
import sys
import time

from mmgcu.runtime.locks import try_lock

fd, holder = try_lock(sys.argv[1], {"pid": os.getpid(), "job": "first"})
print(json.dumps(holder), flush=True)
time.sleep(60)
