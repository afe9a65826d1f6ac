"""A card's memory in a job of many ranks from one measured rank: the steady step, DDP's
buckets, SyncBN's synchronised path, and the verdict that tells the host from the card."""

import os

import torch

from mmgcu.rehearsal import host, memory
from mmgcu.rehearsal.logs import first_error
from mmgcu.rehearsal.phases import Phase
from mmgcu.rehearsal.report import Error
from mmgcu.rehearsal.text import format_report
from tests.conftest import free_port, last_json, needs_torch2, run_program
from tests.rehearsal.helpers import t20_report

GIB = 1 << 30
MIB = 1 << 20
PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")


class Model(torch.nn.Module):
    """Two layers that train and a frozen one: 4 MiB + 1 KiB of gradients."""

    def __init__(self):
        super().__init__()
        self.big = torch.nn.Linear(1024, 1024, bias=False)  # 4 MiB
        self.small = torch.nn.Linear(16, 16)  # 16 x 16 + 16 floats = 1088 bytes
        self.frozen = torch.nn.Linear(64, 64, bias=False)
        self.frozen.weight.requires_grad_(False)


def facts(**extra):
    """What RehearsalMemoryHook writes for one rank of a ViT-L-sized job on torch_gcu 1.x
    that ran one iteration (sizes in GiB as the ViT-L rehearsal measured them)."""
    out = dict(
        rank=0,
        world_size=1,
        stage="train",
        api="gcu1",
        vendor_ddp=True,
        card=0,
        batch_size=2,
        weights_bytes=int(1.43 * GIB),
        gradients=dict(float32=int(1.43 * GIB)),
        bucket_cap=256 * MIB,
        buckets=6,
        sync_bn=dict(
            layers=13,
            largest=dict(
                layer="decode_head.fpn_bottleneck.bn",
                shape=[2, 512, 148, 148],
                dtype="float32",
                extra_bytes=2 * 512 * 148 * 148 * 4,
            ),
        ),
        iterations=1,
        first=dict(
            iter=1,
            peak_bytes=int(19.03 * GIB),
            state_bytes=int(2.85 * GIB),
            gradients_held=int(1.43 * GIB),
        ),
        last=dict(iter=1, peak_bytes=int(19.03 * GIB)),
    )
    out.update(extra)
    return out


def test_gradients_by_dtype_and_buckets_as_torch_fills_them():
    model = Model()
    assert memory.gradient_bytes(model) == dict(float32=4 * MIB + 1088)
    model.small.half()
    assert memory.gradient_bytes(model) == dict(float32=4 * MIB, float16=544)
    # a bucket closes once it holds the cap or more (the last tensor may overflow it)
    assert memory.bucket_count([100, 100, 100], 200) == 2
    assert memory.bucket_count([300, 10], 200) == 2
    assert memory.bucket_count([50] * 8, 200) == 2
    assert memory.bucket_count([], 200) == 0


def test_the_figure_adds_the_steady_step_ddp_buckets_and_sync_bn_for_8_ranks():
    card = 32 * GIB
    figure = memory.per_card(facts(), measured_peak=int(19.10 * GIB), world=8, card_memory=card)
    steady = int(19.03 * GIB) + int(2.85 * GIB) + int(1.43 * GIB)
    assert figure.steady == dict(
        measured=False,
        first_peak=int(19.03 * GIB),
        state=int(2.85 * GIB),
        gradients=int(1.43 * GIB),
        bytes=steady,
    )
    names = [(a["name"], a["when"], a["bytes"]) for a in figure.additions]
    buckets = int(1.43 * GIB)  # a flat copy of every gradient
    sync_bn = 2 * 512 * 148 * 148 * 4  # one float32 copy of the largest SyncBN input
    assert names == [
        ("DDP gradient buckets", "step", buckets),
        ("DDP construction", "once", int(1.43 * GIB) + max(GIB, buckets)),
        ("SyncBN across 8 ranks", "step", sync_bn),
    ]
    assert figure.total_bytes == steady + buckets + sync_bn
    assert figure.fits and figure.world == 8
    text = "\n".join(memory.format_lines(figure))
    assert "memory per card for 8 rank(s), 2 image(s) each" in text
    assert "steady step, worked out: 23.31 GiB = iteration 1's peak 19.03 GiB" in text
    assert "+ DDP gradient buckets: 1.43 GiB (torch_gcu 1.x DDP keeps 6 bucket(s)" in text
    assert "256 MiB (bucket_cap_mb)" in text and "gradient_as_bucket_view=False" in text
    assert "+ SyncBN across 8 ranks: 0.08 GiB" in text and "2x512x148x148 float32" in text
    assert "not included: ECCL's own buffers (not public)" in text
    assert text.endswith("= 24.82 GiB per card of 32.00 GiB: fits")
    # a smaller card
    small = memory.per_card(facts(), int(19.10 * GIB), 8, 24 * GIB)
    assert not small.fits and "DOES NOT FIT" in memory.format_lines(small)[-1]


def test_a_measured_later_step_replaces_the_worked_out_one():
    ran_two = facts(iterations=2, last=dict(iter=2, peak_bytes=int(23.2 * GIB)))
    figure = memory.per_card(ran_two, int(23.2 * GIB), 8, 32 * GIB)
    assert figure.steady == dict(measured=True, bytes=int(23.2 * GIB), through=2)
    assert figure.total_bytes == int(23.2 * GIB) + int(1.43 * GIB) + 2 * 512 * 148 * 148 * 4
    assert "steady step, measured through iteration 2" in "\n".join(memory.format_lines(figure))


def test_what_is_added_depends_on_the_world_and_the_ddp():
    # the measured rank already ran SyncBN's synchronised path: nothing to add for it
    assert memory.sync_bn_addition(facts(world_size=2), 8) is None
    # a job of one card runs plain BatchNorm
    assert memory.sync_bn_addition(facts(), 1) is None
    one = memory.per_card(facts(), int(19.1 * GIB), 1, 32 * GIB)
    assert [a["name"] for a in one.additions] == ["DDP gradient buckets", "DDP construction"]
    # torch_gcu 2.x: torch's own DDP keeps its buckets on the simulated card (measured)
    assert memory.ddp_additions(facts(api="gcu2", vendor_ddp=False)) == []
    # a rank killed in its first iteration: no figure
    assert memory.per_card(facts(first={}, iterations=0), 0, 8, 32 * GIB) is None


def test_sync_bn_extra_is_what_the_simulated_card_measures():
    found = last_json(
        run_program(os.path.join(PROGRAMS, "sync_bn_extra.py"), MMGCU_SIMULATE="t20:1").stdout
    )
    for dtype, element in (("float32", 4), ("float16", 2)):
        measured, size = found[dtype]
        expected = memory._sync_bn_extra([2, 32, 64, 64], element)
        assert size == 2 * 32 * 64 * 64 * element
        # the layer's few per-channel values aside, the extra is the arithmetic's
        assert expected <= measured <= expected + 4096, (dtype, measured, expected)


@needs_torch2
def test_torchs_ddp_keeps_a_copy_of_the_gradients_on_the_simulated_card():
    """The strict reading of torch_gcu 1.x's buckets is what torch's own DDP does, and on
    torch_gcu 2.x (torch's DDP) the simulated card holds them: nothing is added there."""
    found = last_json(
        run_program(
            os.path.join(PROGRAMS, "ddp_buckets.py"),
            MMGCU_SIMULATE="s60:1",
            MASTER_PORT=free_port(),
        ).stdout
    )
    assert found["wrap"] == found["gradients"] == 2 * (1024 * 1024 + 1024) * 4
    assert found["after_backward"] == 2 * found["gradients"]  # and the gradients themselves


def test_real_scale_maps_large_host_blocks_on_their_own():
    assert host.heap_env("real", {}) == {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    assert host.heap_env("small", {}) == {}
    # the user's own heap setting is kept, as the simulator keeps it
    assert host.heap_env("real", {"MALLOC_ARENA_MAX": "2"}) == {}
    assert host.heap_env("real", {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}) == {}


def killed_report(phases, scale="real", figure=None, **extra):
    """A rehearsal report whose rank torchrun says was killed by SIGKILL."""
    log = "  exitcode  : -9 (pid: 26139)\n  traceback : Signal 9 (SIGKILL) received by PID 26139"
    message = first_error(log)
    names = ("build", "placement", "wrap", "train", "save", "val", "resume")
    statuses = [Phase(n, "passed") for n in names[:phases]]
    failed = names[phases:]
    statuses += [Phase(n, "failed" if i == 0 else "not run") for i, n in enumerate(failed)]
    facts = dict(
        config="configs/vitl.py",
        cards=1 if scale == "real" else 8,
        world=8,
        iters=1,
        scale=scale,
        crop=[518, 518],
        config_crop=[518, 518],
        phases=statuses,
        error=Error(failed[0], message, "rehearse on fewer --cards") if failed else None,
        memory=figure,
        json="r.json",
        logs=["train.log", "resume.log"],
    )
    facts.update(extra)
    return t20_report(**facts)


def test_a_rank_killed_for_host_memory_is_not_a_verdict_on_the_card():
    figure = memory.per_card(facts(), int(19.10 * GIB), 8, 32 * GIB)
    report = killed_report(6, figure=figure, finish="mmgcu rehearse configs/vitl.py --cards 2")
    assert host.host_killed(report)
    text = format_report(report)
    verdict = text.split("  verdict: ", 1)[1].splitlines()
    assert verdict[0] == (
        "NOT PROVEN ON THIS HOST: a rank was killed for this host's memory in resume "
        "(simulated cards are host memory); this says nothing of the T20's card"
    )
    assert verdict[1:] == [
        "  proven: build, placement, wrap, train, save, val",
        "  proven: per card for 8 rank(s), 24.82 GiB of 32.00 GiB: fits",
        "  not proven: resume",
        "  finish on this host: mmgcu rehearse configs/vitl.py --cards 2",
    ]
    assert "FAILED" not in text and "fix: rehearse on fewer --cards" not in text
    assert "exitcode -9" in text  # the error itself is still named


def test_a_rank_killed_in_its_first_real_step_says_the_figure_needs_a_larger_host():
    text = format_report(killed_report(3))
    assert "a rank was killed for this host's memory in train" in text
    assert "  proven: build, placement, wrap" in text
    assert "not proven: the per-card figure: the rank was killed before its first" in text
    assert "(mmgcu rehearse configs/vitl.py --scale real)" in text
    assert "  not proven: train, save, val, resume" in text
    # no finish command known: the small scale on the world's ranks
    assert "finish on this host: mmgcu rehearse configs/vitl.py --cards 8" in text


def test_the_finish_command_asks_for_the_ranks_this_host_holds():
    vitl = facts()
    each = int(1.43 * GIB) + int(1.43 * GIB) + int(2.85 * GIB) + host.LIBRARIES
    assert host.rank_bytes(vitl) == each
    report = killed_report(6, figure=None)
    assert host.finish_ranks(report, vitl) == (20 * GIB) // each == 2
    # before the first step: AdamW's two moments of each gradient are assumed
    assert host.rank_bytes(facts(first={})) == int(1.43 * GIB) * 4 + host.LIBRARIES
    # the small scale killed on 8 ranks: half of them at most
    assert host.finish_ranks(killed_report(3, scale="small", host_available=None), None) == 4
    assert host.finish_command(report, vitl) == "mmgcu rehearse configs/vitl.py --cards 2"


def test_a_card_too_small_for_the_job_fails_as_such():
    figure = memory.per_card(facts(), int(19.10 * GIB), 8, 24 * GIB)
    report = killed_report(7, figure=figure)
    assert report.error is None
    text = format_report(report)
    assert text.splitlines()[-1] == (
        "  verdict: DOES NOT FIT A T20 CARD: 24.82 GiB per card for 8 rank(s) against "
        "24.00 GiB (the figure above): make the step smaller (images per card, crop, AMP) "
        "before the T20 sees this config"
    )
