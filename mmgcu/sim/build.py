"""Compile (once per machine) and load the simulator's C++ part.

The build is cached by torch's extension machinery under ``TORCH_EXTENSIONS_DIR``; an
exclusive file lock around it lets eight ranks start at once without corrupting it.
Run ``python -m mmgcu.sim.build`` to pre-build it (``make install`` does).
"""

import fcntl
import hashlib
import os
import os.path as osp

SOURCE = osp.join(osp.dirname(__file__), "csrc", "gcu_sim.cpp")


def load_extension(verbose: bool = False):
    """Return the compiled extension module, building it under a lock if needed."""
    from torch.utils.cpp_extension import _get_build_directory, load

    with open(SOURCE, "rb") as f:
        digest = hashlib.sha1(f.read()).hexdigest()[:10]
    name = f"mmgcu_sim_{digest}"  # a new source gets a new build, never a stale one
    build_dir = _get_build_directory(name, verbose)
    with open(osp.join(build_dir, ".mmgcu.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return load(
                name=name,
                sources=[SOURCE],
                extra_cflags=["-O2"],
                build_directory=build_dir,
                verbose=verbose,
            )
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


if __name__ == "__main__":
    ext = load_extension(verbose=bool(os.environ.get("VERBOSE")))
    print(f"mmgcu simulator extension ready: {ext.__file__}")
