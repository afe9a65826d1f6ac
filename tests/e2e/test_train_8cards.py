"""Stock mmseg tools/train.py, --launcher pytorch, on simulated cards, unchanged."""

import os.path as osp
import sys

import pytest

from tests.conftest import REPO, clean_env, one_worker
from tests.e2e.conftest import (
    DEVICE_TYPE,
    LEG_API,
    LEG_DEVICE,
    checkpoints,
    finish,
    free_port,
    mmseg_tool,
    probes,
    torchrun,
    write_config,
)

pytestmark = pytest.mark.e2e


WRAPPER = {"gcu2": "GCUDistributedDataParallel", "gcu1": "GCU1DistributedDataParallel"}


def assert_trained_on_own_cards(work_dir, world, out, api=LEG_API, iters=4):
    reports = probes(work_dir)
    assert sorted(reports) == list(range(world)), out[-3000:]
    for rank, r in reports.items():
        card = f"{DEVICE_TYPE[api]}:{r['local_rank']}"
        assert r["world_size"] == world
        assert r["param_devices"] == [card], (rank, r)
        assert r["buffer_devices"] == [card], (rank, r)
        assert r["loss_devices"] == [card], (rank, r)
        assert r["wrapper_mro"][0] == WRAPPER[api]
        assert r["iter"] == iters
    params = {round(r["param_checksum"], 4) for r in reports.values()}
    assert len(params) == 1, f"ranks ended with different weights: {params}"
    # SyncBN keeps BN statistics equal on every rank.
    buffers = {round(r["buffer_checksum"], 4) for r in reports.values()}
    assert len(buffers) == 1, buffers
    assert checkpoints(work_dir) == [f"iter_{iters}.pth"]
    assert "mIoU" in out


def openmmlab_warnings(out):
    """Each distinct warning line of ``out`` raised in mmseg, mmengine or mmcv
    (``.../mmseg/models/builder.py:36: UserWarning: ...``), with how often it came."""
    lines = [
        line
        for line in out.splitlines()
        if "Warning: " in line and any(f"/{lib}/" in line for lib in ("mmseg", "mmengine", "mmcv"))
    ]
    return {line: lines.count(line) for line in lines}


@pytest.mark.t20
@one_worker("eight_card_run")
def test_stock_train_on_8_cards(eight_card_run):
    """Stock train.py under torchrun on all 8 cards (tools/dist_train.sh started it; the
    tests of the script and of the demo assert on the same run)."""
    out, work, api = eight_card_run["out"], eight_card_run["work"], eight_card_run["api"]
    assert eight_card_run["code"] == 0, out[-5000:]
    assert_trained_on_own_cards(work, 8, out, api, eight_card_run["iters"])
    # The config's SyncBN stays SyncBN (BN statistics equal on every rank, checked above).
    assert "synchronised across 8 cards by GCUSyncBatchNorm" in out
    assert "reverted to BatchNorm" not in out
    for rank in range(8):
        card = f"{DEVICE_TYPE[api]}:{rank} (card {rank} of 8)"
        assert f"rank {rank} on " in out and card in out
    # mmseg's warnings as the model and hooks are built (``build_loss`` would be deprecated,
    # ...): rank 0's, not one per card.
    seen = openmmlab_warnings(out)
    assert any("/mmseg/" in line for line in seen), out[-5000:]
    assert set(seen.values()) == {1}, seen


def test_two_nodes_of_two_cards(dataset, tmp_path):
    """Ranks 0-3 over two nodes: local ranks repeat, global ranks do not, and each node
    keeps to its own cards (two per node show it as well as four would)."""
    cfg = write_config(tmp_path / "cfg.py", dataset)
    work = str(tmp_path / "work")
    port = free_port()
    args = [mmseg_tool("train.py"), cfg, "--launcher", "pytorch", "--work-dir", work]
    # Two agents on one host split its cards, as they would have to on hardware.
    visible = ["0,1", "2,3"]
    nodes = [
        torchrun(
            args,
            nproc=2,
            cards=2,
            nnodes=2,
            node_rank=n,
            port=port,
            extra_env=dict(TOPS_VISIBLE_DEVICES=visible[n]),
        )
        for n in (0, 1)
    ]
    results = [finish(p) for p in nodes]
    out = "\n".join(o for _, o in results)
    assert [c for c, _ in results] == [0, 0], out[-5000:]
    assert_trained_on_own_cards(work, 4, out)
    reports = probes(work)
    assert sorted(r["local_rank"] for r in reports.values()) == [0, 0, 1, 1]
    assert "physical card 3)" in out


def test_single_process_uses_card_0_and_warns(dataset, tmp_path):
    import subprocess

    cfg = write_config(tmp_path / "cfg.py", dataset)
    work = str(tmp_path / "work")
    proc = subprocess.run(
        [sys.executable, mmseg_tool("train.py"), cfg, "--work-dir", work],
        env=clean_env(MMGCU_SIMULATE=8, MMGCU_SIMULATE_API=LEG_API, OMP_NUM_THREADS=1),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert "using 1 of 8 GCUs" in out
    assert "--nproc_per_node=8" in out
    r = probes(work)[0]
    card = f"{LEG_DEVICE}:0"
    assert r["param_devices"] == [card] and r["buffer_devices"] == [card]
    assert "DistributedDataParallel" not in r["wrapper_mro"]
    assert osp.exists(osp.join(work, "iter_4.pth"))
