"""Ranks that start together on a fresh machine share one build of the C++ part, uncorrupted."""

import glob
import os
import subprocess
import sys

from tests.conftest import REPO, clean_env, last_json
from tests.sim.helpers import sim_code

LOAD = """
import json

from mmgcu.sim.build import load_extension

ext = load_extension()
before = ext.card_count()
ext.install(4)
print(json.dumps({"file": ext.__file__, "before": before, "after": ext.card_count()}))
"""


def test_concurrent_first_build(tmp_path):
    # A fresh TORCH_EXTENSIONS_DIR forces a real compile (a minute or more on two cores).
    ext_dir = tmp_path / "torch_extensions"
    env = clean_env(TORCH_EXTENSIONS_DIR=str(ext_dir))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", sim_code(LOAD)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for _ in range(4)
    ]
    try:
        outputs = [proc.communicate(timeout=600) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    runs = [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs)]
    assert all(code == 0 for code, _, _ in runs), runs
    results = [last_json(out) for out, _ in outputs]
    files = {r["file"] for r in results}
    assert len(files) == 1, files  # one build, loaded by all four
    (so,) = files
    assert os.path.realpath(so).startswith(os.path.realpath(str(ext_dir)))
    assert glob.glob(str(ext_dir / "*" / "*.so")) == [so]
    assert all(r["before"] == 1 and r["after"] == 4 for r in results), results
