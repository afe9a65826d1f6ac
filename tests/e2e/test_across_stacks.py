"""A checkpoint crosses stacks: written by GCURunner on this leg, it loads on the other
(``.venv``: torch 2.13, numpy 2; ``.venv-t20``: the T20's Python 3.8, torch 1.10, numpy 1)
with plain ``torch.load`` (``weights_only=True`` on torch 2.13), ``load_from`` and
``--resume``; what the other leg writes on resuming loads here. Each leg runs this file,
so both directions are tested: the other leg's interpreter is started from here, found
relative to the repository root, and the test skips where that venv does not exist.
"""

import json
import os.path as osp
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.conftest import TORCH_1, last_json, one_worker
from tests.e2e.conftest import REPO, clean_env, write_config
from tests.e2e.test_stock_tools import one_process, trained

pytestmark = [pytest.mark.e2e, pytest.mark.t20, one_worker(__name__)]

OTHER_VENV = ".venv" if TORCH_1 else ".venv-t20"
OTHER_PYTHON = osp.join(REPO, OTHER_VENV, "bin", "python")
OTHER_API = "gcu2" if TORCH_1 else "gcu1"  # torch_gcu 2.x exists only for torch 2.x
pytestmark.append(
    pytest.mark.skipif(
        not osp.exists(OTHER_PYTHON),
        reason=f"{OTHER_PYTHON} does not exist: make install / make install-t20 creates it",
    )
)

#: What plain torch reports about a checkpoint, without mmgcu, mmengine or the simulator.
INSPECT = textwrap.dedent(
    """
    import json, sys
    import torch
    path = sys.argv[1]
    checkpoint = torch.load(path, map_location="cpu")  # weights_only=True on torch >= 2.6
    unsafe = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    loss = checkpoint["message_hub"]["log_scalars"]["train/loss"]
    print(json.dumps(dict(
        torch=torch.__version__,
        unsafe=unsafe(path) if unsafe else None,
        iter=checkpoint["meta"]["iter"],
        losses=len(loss["log_history"]),
        weights=len(checkpoint["state_dict"]),
        modules=sorted({m.split(".")[0] for m in sys.modules} & {"numpy", "mmengine", "mmgcu"}),
    )))
    """
)


def inspect(python, path):
    proc = subprocess.run(
        [python, "-c", INSPECT, path], env=clean_env(), capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return last_json(proc.stdout)


def other_tool(name):
    """The stock mmseg script shipped with the other leg's mmseg."""
    code = "import mmseg, os; print(os.path.join(os.path.dirname(mmseg.__file__), '.mim'))"
    out = subprocess.run([OTHER_PYTHON, "-c", code], capture_output=True, text=True, check=True)
    return osp.join(out.stdout.strip(), "tools", name)


@pytest.fixture(scope="module")
def written_here(dataset, tmp_path_factory):
    """The config and the checkpoint of iteration 2 this leg's GCURunner wrote."""
    return trained(tmp_path_factory.mktemp("across"), dataset)


def test_plain_torch_loads_it_there(written_here):
    _, checkpoint = written_here

    there = inspect(OTHER_PYTHON, checkpoint)

    assert there["torch"].startswith("1." if not TORCH_1 else "2."), there
    assert (there["iter"], there["losses"]) == (2, 2)
    assert there["weights"] > 0
    assert there["unsafe"] in ([], None)  # torch 2.13: no global it would refuse


def test_load_from_there(written_here, tmp_path):
    cfg, checkpoint = written_here
    work = tmp_path / "load_from"
    overrides = ["train_cfg.max_iters=1", f"load_from={checkpoint}"]

    proc = one_process(
        other_tool("train.py"),
        cfg,
        "--work-dir",
        work,
        "--cfg-options",
        *overrides,
        python=OTHER_PYTHON,
        api=OTHER_API,
    )

    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert f"Load checkpoint from {checkpoint}" in out
    assert "Iter(train) [1/1]" in out


def test_resume_there_and_load_what_it_wrote_here(written_here, tmp_path, dataset):
    """The other leg resumes at iteration 2 with the message hub's history; its checkpoint
    of iteration 4 holds all four losses and loads here."""
    _, checkpoint = written_here
    cfg = write_config(tmp_path / "four.py", dataset, train_cfg=dict(max_iters=4))
    work = tmp_path / "resume"

    proc = one_process(
        other_tool("train.py"),
        cfg,
        "--work-dir",
        work,
        "--resume",
        "--cfg-options",
        f"load_from={checkpoint}",
        python=OTHER_PYTHON,
        api=OTHER_API,
    )

    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "resumed epoch: 0, iter: 2" in out
    assert "Iter(train) [4/4]" in out and "Iter(train) [1/4]" not in out
    here = inspect(sys.executable, str(work / "iter_4.pth"))
    assert (here["iter"], here["losses"]) == (4, 4), json.dumps(here)
    assert here["unsafe"] in ([], None)
    if not TORCH_1:
        assert torch.serialization.get_unsafe_globals_in_checkpoint(str(work / "iter_4.pth")) == []
