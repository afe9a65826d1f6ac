"""Run conformance programs on one backend and print each one's counts as a JSON line.

    python -m tests.conformance.run xla|sim [PROGRAM ...]

Every program runs in this one process, in order (each on fresh tensors and models; the
compile cache is the process's, as a job's is).
"""

import json
import sys
import time

from .backends import backend
from .programs import PROGRAMS


def main(argv) -> None:
    be = backend(argv[0])
    for name in argv[1:] or list(PROGRAMS):
        start = time.perf_counter()
        result = PROGRAMS[name](be)
        seconds = round(time.perf_counter() - start, 2)
        print(json.dumps(dict(program=name, result=result, seconds=seconds)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
