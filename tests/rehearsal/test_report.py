"""The typed report: what the ranks wrote summed up, its verdict, and its plain values
(what ``rehearse()`` returns and ``rehearsal.json`` holds)."""

import json

from mmgcu.rehearsal.memory import MemoryFigure
from mmgcu.rehearsal.phases import Phase
from mmgcu.rehearsal.report import CardPeak, Error, Reads, Summary, summarise
from tests.rehearsal.helpers import GIB, rank, t20_report

#: The keys of a rehearsal's report before its jobs ran, in rehearsal.json's order.
KEYS = [
    "config",
    "hardware",
    "api",
    "cards",
    "world",
    "host_available",
    "iters",
    "scale",
    "torch",
    "work_dir",
    "json",
    "logs",
    "notes",
    "crop",
    "config_crop",
    "phases",
    "error",
    "summary",
    "passed",
]


def figure(total: int, card: int) -> MemoryFigure:
    steady = dict(measured=True, bytes=total, through=2)
    return MemoryFigure(8, 0, 2, total, steady, [], total, total, card, total <= card)


def test_plain_values_keep_rehearsal_jsons_keys():
    before = t20_report()
    assert list(before.to_dict()) == KEYS
    assert before.to_dict()["summary"] == {} and before.to_dict()["crop"] == [0, 0]
    ran = t20_report(seconds=dict(train=3.5), phases=[Phase("build", "passed")])
    ran.error = Error("train", "KeyError: 'x'")
    values = ran.to_dict()
    assert list(values) == KEYS + ["seconds"]  # no memory figure at the small scale
    assert values["phases"] == [dict(name="build", status="passed", detail=None)]
    assert values["error"] == dict(phase="train", message="KeyError: 'x'", fix=None)
    real = t20_report(scale="real", seconds=dict(train=9.0), finish="mmgcu rehearse c.py --cards 1")
    assert list(real.to_dict()) == KEYS + ["seconds", "memory", "finish"]
    assert real.to_dict()["memory"] is None  # the rank did not finish its first iteration
    json.dumps(real.to_dict())


def test_it_passes_when_every_phase_passed_no_error_and_the_card_holds_the_job():
    passed = [Phase("build", "passed"), Phase("val", "skipped")]
    for case, expected in (
        (t20_report(phases=passed), True),
        (t20_report(phases=[]), False),
        (t20_report(phases=passed + [Phase("resume", "failed")]), False),
        (t20_report(phases=passed, error=Error("end", "exit status 1")), False),
        (t20_report(phases=passed, memory=figure(33 * GIB, 32 * GIB)), False),
        (t20_report(phases=passed, memory=figure(31 * GIB, 32 * GIB)), True),
    ):
        case.settle()
        assert case.passed is expected, case


def test_the_summary_of_what_the_ranks_wrote():
    train = {
        r: dict(rank(r, 3), peak_bytes=(r + 1) * GIB, amp="float16", sync_bn=dict(layers=2))
        for r in (0, 1)
    }
    for r in (0, 1):
        for i, entry in enumerate(train[r]["iterations"]):
            entry.update(host_reads=3 - min(i, 2), losses=dict(loss=1.0 - i / 10))
    resume = {1: dict(rank(1, 1, 3), peak_bytes=3 * GIB)}
    summary = summarise(train, resume, card_memory=2 * GIB + 1)
    assert summary.cards == [CardPeak(0, 0, GIB, True), CardPeak(1, 1, 3 * GIB, False)]
    assert (summary.peak_bytes, summary.fits) == (3 * GIB, False)
    assert summary.host_reads_per_iter == Reads(first=3, later=1.5)
    assert summary.graph_runs_per_step == 1  # a lazy card: its graphs too
    assert (summary.graph.train["runs_later"], summary.graph.train["compiles_later"]) == (1, 0)
    assert [e["iter"] for e in summary.losses] == [1, 2, 3]
    assert summary.losses[1]["loss"] == 0.9 and summary.amp == "float16"
    eager = {0: dict(rank(0, 2), lazy=False)}
    for entry in eager[0]["iterations"]:
        del entry["graph_runs"], entry["compiles"], entry["cuts"]
    assert summarise(eager, {}, GIB).graph_runs_per_step is None
    assert summarise(eager, {}, GIB).graph is None
    assert summarise({}, {}, GIB) is None
    assert isinstance(summary, Summary)
