"""What a passing rehearsal of the tiny model on 2 simulated T20 cards reports: shared by
``tests/rehearsal/test_rehearse.py`` and the README walkthrough's test, which rehearse it
through ``python -m mmgcu.cli`` and the ``mmgcu`` command line."""

import os


def assert_tiny_model_passed_every_phase(report: dict, out: str, checkpoint: str) -> None:
    """``report`` (``rehearsal.json``) and ``out`` (the printed report) of the tiny model
    (23 SyncBN layers, 2 iterations, validation) whose ``checkpoint`` (a pretrained file)
    is not on this machine."""
    assert [p["status"] for p in report["phases"]] == ["passed"] * 7, report["phases"]
    assert report["hardware"] == "T20" and report["api"] == "gcu1"
    (note,) = [n for n in report["notes"] if "random initialisation" in n]
    assert repr(checkpoint) in note and note in out
    summary = report["summary"]
    assert [c["card"] for c in summary["cards"]] == [0, 1]
    assert all(
        0 < c["peak_bytes"] < summary["card_memory_bytes"] and c["fits"] for c in summary["cards"]
    )
    # one read per log line, one line per iteration
    assert summary["host_reads_per_iter"]["later"] == 1
    assert summary["graph_runs_per_step"] == 1
    assert summary["sync_bn"]["classes"] == {"GCUSyncBatchNorm": 23}
    assert [e["iter"] for e in summary["losses"]] == [1, 2]
    assert [e["iter"] for e in summary["resume_losses"]] == [3]
    # the resumed job trains on from iter_2.pth and saves nothing of its own
    saved = [name for name in os.listdir(report["work_dir"]) if name.endswith(".pth")]
    assert saved == ["iter_2.pth"], saved
    assert "mIoU" in summary["val"]
    assert "card 1 (rank 1): peak" in out and "PASSED" in out
