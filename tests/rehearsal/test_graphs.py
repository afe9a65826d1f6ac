"""What a rehearsal says of a lazy card's graphs: per step and per image, whether the job
stalls the card, and the fix (mmgcu/rehearsal/graphs.py and the report's lines)."""

from mmgcu.rehearsal.graphs import stalls, train_figures, val_figures
from mmgcu.rehearsal.phases import Phase
from mmgcu.rehearsal.report import CardPeak, GraphPart, Reads, Summary
from mmgcu.rehearsal.text import format_report
from tests.rehearsal.helpers import t20_report


def _iteration(runs, compiles, cuts=()):
    return dict(graph_runs=runs, compiles=compiles, cuts=list(cuts))


ACC = dict(
    cause="fallback",
    what="aten::nonzero",
    caller="mmseg/models/losses/accuracy.py:49",
    runs=2,
    compiles=1,
)


def test_a_stock_head_runs_three_graphs_a_step_and_compiles_every_step():
    figures = train_figures([_iteration(3, 2, [ACC]), *[_iteration(3, 1, [ACC])] * 3])
    assert figures["runs_first"] == 3 and figures["runs_later"] == 3
    assert figures["compiles_warm_up"] == 3 and figures["compiles_later"] == 2
    assert figures["cuts"] == [
        dict(cause="fallback", what="aten::nonzero", caller=ACC["caller"], per_step=2.0)
    ]
    found = stalls(figures, None, 0.25)
    assert [s["what"] for s in found] == [
        "a training step runs 3 graphs (aten::nonzero at mmseg/models/losses/accuracy.py:49)",
        "2 graph(s) compiled in 2 step(s) after warm-up",
    ]
    assert "indexing by a mask at mmseg/models/losses/accuracy.py:49" in found[0]["fix"]
    assert "every step recompiles" in found[1]["cost"]


def test_one_graph_a_step_and_none_compiled_after_warm_up_stalls_nothing():
    figures = train_figures([_iteration(1, 1), _iteration(1, 1), _iteration(1, 0)])
    assert (figures["runs_later"], figures["compiles_later"], figures["cuts"]) == (1, 0, [])
    assert stalls(figures, None, 1.0) == []


def test_a_read_in_the_step_is_named_with_its_line():
    read = dict(ACC, cause="host_read", what="aten::_local_scalar_dense", caller="my/loss.py:7")
    figures = train_figures([_iteration(2, 1, [read])] * 2 + [_iteration(2, 0, [read])])
    (found,) = stalls(figures, None, 1.0)
    assert "do not read a card value in the step (my/loss.py:7" in found["fix"]


def test_warm_up_alone_says_what_it_cannot_tell():
    figures = train_figures([_iteration(1, 1), _iteration(1, 1)])
    assert figures["runs_later"] is None and figures["compiles_later"] is None
    assert stalls(figures, None, 1.0) == []


def _val(compiles, shapes):
    graph = dict(graph_runs=len(shapes), compiles=compiles, cuts=[])
    return dict(images=len(shapes), input_shapes=shapes, graph=graph)


def test_a_validation_that_compiles_per_shape_is_fixed_with_a_test_size():
    shapes = [[128, 171], [171, 128], [128, 228], [128, 128]]
    figures = val_figures(_val(4, shapes))
    assert figures == dict(
        images=4, input_shapes=4, largest=[171, 228], compiles=4, runs_per_image=1.0, cuts=[]
    )
    (found,) = stalls(None, figures, 0.25)
    assert found["cost"] == "validation compiles a graph per image size"
    # the largest sides at the config's scale (x4), rounded up to 32
    assert "test_cfg = dict(size=(704, 928))" in found["fix"]


def test_a_validation_within_its_buckets_stalls_nothing():
    figures = val_figures(_val(2, [[128, 171], [171, 128], [128, 160], [160, 128]]))
    assert stalls(None, figures, 0.25) == []


def test_the_report_says_the_graphs_and_that_the_job_stalls_the_card():
    train = train_figures([_iteration(3, 2, [ACC]), *[_iteration(3, 1, [ACC])] * 2])
    val = val_figures(_val(2, [[128, 171], [171, 128]]))
    summary = Summary(
        cards=[CardPeak(rank=0, card=0, peak_bytes=1 << 30, fits=True)],
        peak_bytes=1 << 30,
        card_memory_bytes=32 << 30,
        host_reads_per_iter=Reads(first=1, later=1),
        graph=GraphPart(
            train=train,
            val=val,
            changes=["EncoderDecoder x1: predictions post-processed on the host"],
            kept=["EncHead x1"],
            stalls=stalls(train, val, 0.25),
        ),
        sync_bn={},
    )
    passed = t20_report(
        iters=3,
        crop=[128, 128],
        config_crop=[512, 512],
        phases=[Phase("build", "passed")],
        summary=summary,
        passed=True,
        logs=["train.log"],
    )
    text = format_report(passed)
    assert "graph runs per step: 3 in the first, 3 after warm-up" in text
    assert "graphs compiled in training: 3 in the first 2 step(s), 1 in 1 after" in text
    assert "extra graph run: 2.0 a step, aten::nonzero (fallback) at mmseg/models/" in text
    assert "validation: 2 graph(s) compiled for 2 image(s) of 2 input shape(s)" in text
    assert "kept whole by mmgcu: EncoderDecoder x1: predictions post-processed" in text
    assert "not changed: EncHead x1's own loss code" in text
    assert text.count("STALLS THE CARD:") == 3  # two in training, one in validation
    assert "verdict: PASSED, BUT IT STALLS THE CARD (3 cause(s) above)" in text
