"""Locks a file, says so, and only 0.3 s later writes who holds it, for tests/runtime/test_locks.py:
``python lock_slow_writer.py PATH`` (the window in which the file still names its previous
holder)."""

import fcntl
import json
import os
import sys
import time

fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(0.3)
os.ftruncate(fd, 0)
os.pwrite(fd, json.dumps({"pid": os.getpid(), "job": "new"}).encode(), 0)
time.sleep(60)
