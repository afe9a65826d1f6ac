"""A checkpoint write that fails half-way (the disk fills up) at the second save; prints,
as JSON, what was written, the error, the files left and ``last_checkpoint``.

Environment: WORK_DIR, KEEP (the CheckpointHook's max_keep_ckpts).
"""

import json
import os

import torch
from tiny_runner import runner

write = torch.save  # what GCURunner writes a checkpoint file with
calls = []


def fails_on_second_save(checkpoint, filename, *args, **kwargs):
    calls.append(os.path.basename(filename))
    if len(calls) == 2:  # half a file, then the disk fills up
        with open(filename, "wb") as f:
            f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(28, "No space left on device")
    return write(checkpoint, filename, *args, **kwargs)


torch.save = fails_on_second_save  # the test's fault, in its own process
work = os.environ["WORK_DIR"]
job = runner(work, "half_write", max_iters=6, keep=int(os.environ["KEEP"]))
try:
    job.train()
    error = None
except OSError as e:
    error = str(e)
with open(os.path.join(work, "last_checkpoint")) as f:
    last = f.read()
print(json.dumps(dict(calls=calls, error=error, files=sorted(os.listdir(work)), last=last)))
