"""Compile (once per machine) and load the simulator's C++ part.

The sources are in ``csrc/``: ``gcu_sim.h`` is shared, ``gcu_sim.cpp`` is built for torch >= 2
(torch_gcu 2.x) and ``gcu_sim_torch110.cpp`` for torch 1.10 (torch_gcu 1.x, the T20's stack).
The build is cached by torch's extension machinery under ``TORCH_EXTENSIONS_DIR``; an
exclusive file lock around it lets eight ranks start at once without corrupting it.
Run this file as a script (``python mmgcu/sim/build.py``) to pre-build it.
"""

import fcntl
import hashlib
import importlib.util
import os
import os.path as osp
import re
import shutil
import sys
from contextlib import contextmanager

CSRC = osp.join(osp.dirname(osp.abspath(__file__)), "csrc")
SOURCES = {"torch2": "gcu_sim.cpp", "torch110": "gcu_sim_torch110.cpp"}
#: Written in the build folder once torch's ``load`` has built and loaded the module there.
BUILT_MARK = ".mmgcu-built"


def source_for(torch_version: str) -> str:
    """The translation unit to build for ``torch_version`` (e.g. ``'2.13.0+cpu'``)."""
    match = re.match(r"(\d+)\.(\d+)", torch_version)
    major, minor = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    if major >= 2:
        return osp.join(CSRC, SOURCES["torch2"])
    if (major, minor) == (1, 10):
        return osp.join(CSRC, SOURCES["torch110"])
    raise RuntimeError(
        f"the simulated GCU needs torch >= 2 (as torch_gcu 2.x) or torch 1.10 (as torch_gcu "
        f"1.x on the T20), found torch {torch_version}"
    )


def _env_bin() -> str:
    """The bin directory of the environment running this Python (where its ninja is)."""
    return osp.dirname(sys.executable)


@contextmanager
def _env_bin_first_on_path():
    """Put this environment's bin directory first on PATH for the build.

    torch runs ``ninja`` from PATH. ``.venv/bin/python`` run directly (as ``make`` does) and an
    activated venv see different PATHs, so they would find different ninja executables (the
    system's and the venv's). Ninja versions keep incompatible build logs, so each would
    rebuild the other's build folder: with the environment's own ninja first, both use one.
    """
    saved = os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join(p for p in (_env_bin(), saved) if p)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["PATH"]
        else:
            os.environ["PATH"] = saved


def build_key(source: str, torch_version: str, ninja: str) -> str:
    """The build folder's name: a build per sources, checkout, torch and ninja.

    Every file in csrc/ is hashed (the header is compiled into each source). Ninja records
    the source's path, so two checkouts sharing one build folder would rebuild each other's
    on every start; and a different ninja would rebuild a folder another ninja built.
    """
    digest = hashlib.sha1()
    for name in sorted(os.listdir(CSRC)):
        path = osp.join(CSRC, name)
        if osp.isfile(path) and name.endswith((".cpp", ".h")):
            with open(path, "rb") as f:
                digest.update(name.encode() + b"\0" + f.read() + b"\0")
    for part in (osp.abspath(source), torch_version, ninja):
        digest.update(part.encode() + b"\0")
    return f"mmgcu_sim_{digest.hexdigest()[:10]}"


def _built(build_dir: str, name: str):
    """The module built in ``build_dir`` if a finished build left its mark, else None.

    The folder's name hashes every source (contents, not times), so a marked build there is
    this source's: it is loaded without running ninja, whose check goes by modification
    times (a reinstalled mmgcu has new ones) and costs every rank a subprocess under the lock.
    """
    path = osp.join(build_dir, f"{name}.so")
    mark = osp.join(build_dir, BUILT_MARK)
    if not (osp.exists(path) and osp.exists(mark)):
        return None
    with open(mark) as f:
        if f.read().strip() != name:
            return None
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def extensions_root() -> str:
    """Where torch's extension machinery keeps this interpreter's builds:
    ``TORCH_EXTENSIONS_DIR``, else
    ``<cache>/torch_extensions/py<XY><abiflags>_<cpu|cuXY|rocmXY>``. Worked out without
    importing ``torch.utils.cpp_extension``: that import (setuptools, hipify's regexes)
    cost every torch 1.10 process 0.25 s. A guess that only finds a marked build: where
    it misses, :func:`load_extension` asks torch."""
    import torch

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return root
    cache = os.environ.get("XDG_CACHE_HOME") or osp.expanduser("~/.cache")
    if torch.version.hip is not None:
        accelerator = "rocm" + torch.version.hip.replace(".", "")
    elif torch.version.cuda is not None:
        accelerator = "cu" + torch.version.cuda.replace(".", "")
    else:
        accelerator = "cpu"
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    python += getattr(sys, "abiflags", "")  # torch 2's rule; "" on a standard build
    return osp.join(osp.realpath(osp.join(cache, "torch_extensions")), f"{python}_{accelerator}")


def load_extension(verbose: bool = False):
    """Return the compiled extension module, building it under a lock if needed."""
    import torch

    source = source_for(torch.__version__)
    with _env_bin_first_on_path():
        ninja = shutil.which("ninja") or ""
        name = build_key(source, torch.__version__, osp.realpath(ninja) if ninja else "")
        module = _built(osp.join(extensions_root(), name), name)
        if module is not None:
            return module
        from torch.utils.cpp_extension import _get_build_directory, load

        build_dir = _get_build_directory(name, verbose)
        module = _built(build_dir, name)
        if module is not None:
            return module
        with open(osp.join(build_dir, ".mmgcu.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                module = load(
                    name=name,
                    sources=[source],
                    extra_cflags=["-O2"],
                    build_directory=build_dir,
                    verbose=verbose,
                )
                with open(osp.join(build_dir, BUILT_MARK), "w") as f:
                    f.write(name)
                return module
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


if __name__ == "__main__":
    ext = load_extension(verbose=bool(os.environ.get("VERBOSE")))
    print(f"mmgcu simulator extension ready: {ext.__file__}")
