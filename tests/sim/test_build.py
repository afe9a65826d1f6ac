"""Ranks that start together on a fresh machine share one build of the C++ part, uncorrupted;
later starts load it without running the build tools."""

import glob
import json
import os
import shutil

import pytest

from tests.conftest import TORCH_1, run_python
from tests.sim.helpers import run_ranks

#: A later start: torch's load() (ninja, the build lock) refused, the build loaded by its mark.
LATER_START = """
    import torch.utils.cpp_extension as cpp

    def refuse(**kwargs):
        raise SystemExit("torch's load() was called")

    cpp.load = refuse
    from mmgcu.sim.build import load_extension
    print(load_extension().__file__)
"""


#: A later start that reports whether it imported torch's extension machinery.
QUIET_START = """
    import json, sys
    from mmgcu.sim.build import load_extension
    print(json.dumps([load_extension().__file__, "torch.utils.cpp_extension" in sys.modules]))
"""


def printed_file(proc) -> str:
    """The file a snippet printed last (the extension module it loaded)."""
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.long
@pytest.mark.skipif(
    not TORCH_1,
    reason="the T20 leg builds it (23 CPU-s there, 40 here): the lock and the mark are the "
    "same code for both torch generations, and both legs' installs build it once",
)
def test_concurrent_first_build(tmp_path):
    # A fresh TORCH_EXTENSIONS_DIR forces a real compile.
    ext_dir = tmp_path / "torch_extensions"
    # Four processes at once, as the ranks of a first launch would start.
    results = run_ranks(
        "load_extension", world_size=4, timeout=600, TORCH_EXTENSIONS_DIR=str(ext_dir)
    )
    files = {r["file"] for r in results}
    assert len(files) == 1, files  # one build, loaded by all four
    (so,) = files
    assert os.path.realpath(so).startswith(os.path.realpath(str(ext_dir)))
    assert glob.glob(str(ext_dir / "*" / "*.so")) == [so]
    assert all(r["before"] == 1 and r["after"] == 4 for r in results), results
    env = dict(TORCH_EXTENSIONS_DIR=str(ext_dir))
    assert printed_file(run_python(LATER_START, **env)) == so


def test_a_marked_build_loads_without_the_build_tools(tmp_path):
    """A reinstalled mmgcu has new file times, which ninja would take for changed sources:
    a finished build (marked) is loaded without torch's load(), an unfinished one is not."""
    # A copy of this environment's build (make install's), in a folder of the test's own.
    built = run_python(
        "from mmgcu.sim.build import load_extension; print(load_extension().__file__)"
    )
    folder = os.path.dirname(printed_file(built))
    ext_dir = tmp_path / "torch_extensions"
    shutil.copytree(folder, str(ext_dir / os.path.basename(folder)))
    (so,) = glob.glob(str(ext_dir / "*" / "*.so"))
    env = dict(TORCH_EXTENSIONS_DIR=str(ext_dir))
    assert printed_file(run_python(LATER_START, **env)) == so
    (mark,) = glob.glob(str(ext_dir / "*" / ".mmgcu-built"))
    os.remove(mark)  # an unfinished build: torch's load() again
    out = run_python(LATER_START, check=False, **env)
    assert out.returncode != 0 and "torch's load() was called" in out.stderr


def test_a_marked_build_loads_without_torchs_extension_machinery(tmp_path):
    """Importing torch.utils.cpp_extension (setuptools, hipify) cost every torch 1.10
    process a quarter of a second: a marked build, in torch's default folder or in
    TORCH_EXTENSIONS_DIR, is found without it."""
    run_python("from mmgcu.sim.build import load_extension; load_extension()")  # built
    so, imported = json.loads(printed_file(run_python(QUIET_START)))
    assert not imported, so
    ext_dir = tmp_path / "torch_extensions"
    folder = os.path.dirname(so)
    shutil.copytree(folder, str(ext_dir / os.path.basename(folder)))
    so, imported = json.loads(printed_file(run_python(QUIET_START, TORCH_EXTENSIONS_DIR=ext_dir)))
    assert so.startswith(str(ext_dir)) and not imported
