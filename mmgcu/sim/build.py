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
    import torch
    from torch.utils.cpp_extension import _get_build_directory, load

    with open(SOURCE, "rb") as f:
        source = f.read()
    # A build per source, checkout and torch: ninja records the source's path, so two
    # checkouts sharing one build folder would rebuild each other's on every start.
    key = source + osp.abspath(SOURCE).encode() + torch.__version__.encode()
    name = f"mmgcu_sim_{hashlib.sha1(key).hexdigest()[:10]}"
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
