"""Ranks that start together on a fresh machine share one build of the C++ part, uncorrupted;
later starts load it without running the build tools."""

import glob
import os

from tests.conftest import run_python
from tests.sim.helpers import run_ranks


def test_concurrent_first_build(tmp_path):
    # A fresh TORCH_EXTENSIONS_DIR forces a real compile (a minute or more on two cores).
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

    # Later starts load the marked build without torch's load() (no ninja run, no lock):
    # a reinstalled mmgcu has new file times, which ninja would take for changed sources.
    snippet = """
        import torch.utils.cpp_extension as cpp

        def refuse(**kwargs):
            raise SystemExit("torch's load() was called")

        cpp.load = refuse
        from mmgcu.sim.build import load_extension
        print(load_extension().__file__)
    """
    env = dict(TORCH_EXTENSIONS_DIR=str(ext_dir))
    assert run_python(snippet, **env).stdout.strip().splitlines()[-1] == so
    (mark,) = glob.glob(str(ext_dir / "*" / ".mmgcu-built"))
    os.remove(mark)  # an unfinished build: torch's load() again
    out = run_python(snippet, check=False, **env)
    assert out.returncode != 0 and "torch's load() was called" in out.stderr
