"""Shared by the rehearsal's tests: what one rank writes, a report built with the typed
report's constructors, and what a passing rehearsal of the tiny model on 2 simulated T20
cards reports (``tests/rehearsal/test_rehearse.py`` and the README walkthrough's test
rehearse it through ``python -m mmgcu.cli`` and the ``mmgcu`` command line)."""

import os

from mmgcu.rehearsal.report import Report

GIB = 1 << 30


def rank(index, stage_iters=2, resumed_from=None, **extra):
    """What RehearsalHook writes for rank ``index`` of a job on simulated T20 cards."""
    phases = [dict(name=n) for n in ("build", "val", "train", "end")]
    return dict(
        rank=index,
        card=index,
        api="gcu1",
        device_type="xla",
        lazy=True,
        phases=phases,
        param_devices=[f"xla:{index}"],
        wrapper="GCU1DistributedDataParallel",
        wrapped=True,
        iterations=[
            dict(iter=i + 1, host_reads=1, graph_runs=1, compiles=int(i < 2), cuts=[], seconds=0.5)
            for i in range(stage_iters)
        ],
        resumed_from=resumed_from,
        **extra,
    )


def t20_report(**fields):
    """A report of 2 simulated T20 cards at the small scale, ``fields`` changed."""
    facts = dict(
        config="c.py",
        hardware="T20",
        api="gcu1",
        cards=2,
        world=2,
        host_available=20 * GIB,
        iters=2,
        scale="small",
        torch="1.10.2",
        work_dir="w",
        json="w/rehearsal.json",
    )
    facts.update(fields)
    return Report(**facts)


def assert_tiny_model_passed_every_phase(report: dict, out: str, checkpoint: str) -> None:
    """``report`` (``rehearsal.json``) and ``out`` (the printed report) of the tiny model
    (23 SyncBN layers, 3 iterations, validation) whose ``checkpoint`` (a pretrained file)
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
    # the lazy card: one graph a step, none compiled after the first two; validation
    # within its shape buckets; mmgcu's changes named, and no stall
    graph = summary["graph"]
    assert graph["train"]["runs_first"] == 1 and graph["train"]["runs_later"] == 1
    assert graph["train"]["compiles_later"] == 0 and graph["train"]["cuts"] == []
    assert 0 < graph["val"]["compiles"] <= graph["val"]["input_shapes"], graph["val"]
    assert any(c.startswith("FCNHead x1: acc_seg") for c in graph["changes"])
    assert graph["stalls"] == []
    assert "graph runs per step: 1 in the first, 1 after warm-up" in out
    assert summary["sync_bn"]["classes"] == {"GCUSyncBatchNorm": 23}
    assert [e["iter"] for e in summary["losses"]] == [1, 2, 3]
    assert [e["iter"] for e in summary["resume_losses"]] == [4]
    # the resumed job trains on from iter_3.pth and saves nothing of its own
    saved = [name for name in os.listdir(report["work_dir"]) if name.endswith(".pth")]
    assert saved == ["iter_3.pth"], saved
    assert "mIoU" in summary["val"]
    assert "card 1 (rank 1): peak" in out and "PASSED" in out
