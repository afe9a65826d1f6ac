"""What ``mmgcu rehearse`` prints of a report: the run, each phase, the error, the verdict."""

from mmgcu.rehearsal.phases import Phase
from mmgcu.rehearsal.report import CardPeak, Error, Reads, Summary
from mmgcu.rehearsal.text import format_report
from tests.rehearsal.helpers import GIB, t20_report


def test_the_text_names_each_phase_and_the_verdict():
    phases = [Phase(n, "passed") for n in ("build", "train")] + [Phase("val", "failed")]
    failed = t20_report(
        crop=[128, 128],
        config_crop=[512, 512],
        notes=["pretrained weights not found locally"],
        phases=phases,
        error=Error("val", "KeyError: 'mIoU'"),
        logs=["train.log"],
    )
    text = format_report(failed)
    assert text.splitlines()[0] == (
        "mmgcu rehearse c.py: 2 simulated T20 card(s) (torch_gcu 1.x, torch 1.10.2), 2 "
        "iteration(s), scale small (crop 128x128 for the config's 512x512)"
    )
    assert "note: pretrained weights not found locally" in text
    assert "  val        failed" in text and "error (val): KeyError: 'mIoU'" in text
    assert text.endswith("FAILED: fix the error above before the T20 sees this config")


def test_a_passing_report_of_s60_cards_names_each_cards_peak():
    summary = Summary(
        cards=[CardPeak(0, 0, GIB, True), CardPeak(1, 1, 2 * GIB, True)],
        peak_bytes=2 * GIB,
        card_memory_bytes=32 * GIB,
        host_reads_per_iter=Reads(first=2, later=1),
        losses=[dict(iter=1, loss=0.5)],
    )
    passed = t20_report(hardware="S60", api="gcu2", phases=[Phase("build", "passed")])
    passed.summary, passed.passed = summary, True
    lines = format_report(passed).splitlines()
    assert "(torch_gcu 2.x, torch 1.10.2)" in lines[0]
    assert "  card 1 (rank 1): peak 2.00 GiB of 32.00 GiB: fits" in lines
    assert "  card reads per iteration: 2 in the first, 1 after (a log line every " in "\n".join(
        lines
    )
    assert "  iter 1: loss 0.50000" in lines
    assert lines[-1] == "  verdict: PASSED: launch it on the S60 with mmgcu train CONFIG"
