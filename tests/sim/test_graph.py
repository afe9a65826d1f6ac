"""The simulated T20 card's lazy graph (``mmgcu/sim/csrc/lazy_graph.h``): what runs a graph,
what compiles one, what falls back to the CPU, as torch_xla does with the same code.

One program (``programs/lazy_graph.py``) measures each case in a fresh process; each
assertion names the torch_xla behaviour it holds the simulator to. ``tests/conformance``
runs whole programs against torch_xla itself.
"""

import json

import pytest

from tests.sim.helpers import run_sim


def _run(profile):
    proc = run_sim("lazy_graph", cards="t20:1", MMGCU_SIM_XLA=profile)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def t20():
    return _run("t20")


@pytest.fixture(scope="module")
def xla_cpu():
    return _run("xla-cpu")


def test_uploading_runs_no_graph(t20):
    assert t20["upload"] == [0, 0, 0, {}]


def test_a_copy_to_the_host_runs_a_graph_and_keeps_its_result(t20):
    """a.cpu() runs a's graph and a holds device data from then on (a second read is a
    transfer); b = a + 1 read later runs a graph that computes a again
    (XLATensor::ApplyPendingGraph syncs the tensor read, not the IR that uses it)."""
    assert t20["reads"] == [2, 2, 0, {}]


def test_a_scalar_read_runs_a_graph_and_keeps_the_ir(t20):
    """.item() falls back (aten::_local_scalar_dense): its input's graph runs, and the input
    keeps its IR, so a second .item() runs the same graph again, found compiled."""
    assert t20["items"] == [2, 1, 1, {"aten::_local_scalar_dense": 2}]


def test_masked_indexing_runs_the_masks_graph_and_falls_back_to_nonzero(t20):
    assert t20["mask_index"] == [2, 2, 0, {"aten::nonzero": 1}]


def test_scalars_are_data_except_zero_and_one(t20):
    """x * 3.5 and x * 4.5 (and x * 2.0) are one graph; x * 1.0 another (torch_xla's
    IsSpecialScalar folds 0 and +-1 into the graph)."""
    assert t20["scalars"] == [[1, 1, 0, {}], [1, 0, 1, {}], [1, 1, 0, {}], [1, 0, 1, {}]]


def test_a_zero_dim_upload_of_zero_or_one_is_a_constant(t20):
    """torch.tensor(0.).to(card) is a pending constant (reading it runs a graph);
    torch.tensor(2.).to(card) is data (BatchNorm's num_batches_tracked compiles a second
    step graph this way)."""
    assert t20["constant_upload"] == [1, 0]


def test_a_step_runs_the_graph_of_what_it_is_given_or_of_everything_live(t20):
    """unlazy([a]) outputs a alone (b stays pending); sync_lived_tensor outputs b."""
    assert t20["step_pending"] == [1, 0]
    assert t20["step"][0] == 2


def test_a_write_through_a_view_leaves_its_storage_pending(t20):
    assert t20["partial_pending"] == 1 and t20["partial_write"][:2] == [1, 1]


def test_a_graph_seen_before_is_taken_from_the_cache_until_it_is_cleared(t20):
    assert t20["cache"] == [2, 1, 1, {}]
    assert t20["cache_cleared"] == [1, 1, 0, {}]  # torch_gcu.clear_graph_caches()


def test_a_cut_names_its_python_line(t20):
    assert t20["caller"].startswith("tests/sim/programs/lazy_graph.py:")


def test_the_profiles_differ_by_the_tpu_only_resize_backward(t20, xla_cpu):
    """torch_xla on a CPU device falls back for upsample_bilinear2d_backward (a TPU-only
    lowering); the T20 profile assumes Enflame's compiler lowers it. A fallback in
    backward has no Python line: it runs on autograd's thread."""
    assert t20["backward"] == [0, 0, 0, {}]
    assert xla_cpu["backward"] == [1, 1, 0, {"aten::upsample_bilinear2d_backward": 1}]
    assert xla_cpu["backward_callers"] == ["backward"]


def test_an_adaptive_pool_of_sides_that_do_not_divide_falls_back(t20, xla_cpu):
    """torch_xla's IsSupportedAdaptivePool: 8 % 4 lowers, 8 % 3 falls back (PSPNet's 3 and
    6 on a map of 16), on both generations."""
    for run in (t20, xla_cpu):
        assert run["adaptive"] == [[1, 1, 0, {}], [0, 0, 0, {"aten::_adaptive_avg_pool2d": 1}]]


def test_ops_torch_xla_lowers_whole_are_whole_where_torch_has_a_composite(t20, xla_cpu):
    """torch_xla's own kernel for repeat and mv wins over torch's composite, whose unfold
    and addmv_ it does not lower: one graph, no fallback. roll: lowered by 2.9 only (on
    1.10 it runs on the host, its input being device data: no graph)."""
    for run in (t20, xla_cpu):
        for op in ("repeat", "tile", "mv"):
            assert run["whole"][op] == [1, 1, 0, {}], op
    assert t20["whole"]["roll"] == [0, 0, 0, {"aten::roll": 1}]
    assert xla_cpu["whole"]["roll"] == [1, 1, 0, {}]


def test_other_threads_count_too(t20):
    assert t20["thread"][0] == 1


def test_the_metrics_report_gives_the_count_of_compiles_mmgcu_reads(t20):
    """torch_gcu.metrics_report() in torch_xla 1.x's format, whose UncachedCompile counter
    GCU1Accelerator.compiled_graphs reads (the compile watch's figure)."""
    compiled, uncached = t20["compiled"]
    assert compiled == uncached >= 10
    assert "Metric: CompileTime\n  TotalSamples: " in t20["report"]
    assert "Counter: aten::nonzero\n  Value: 3\n" in t20["report"]  # mask_index, empty_index


def test_the_off_profile_keeps_no_graph():
    """``MMGCU_SIM_XLA=off`` (what ``make bench`` compares against): the same program counts
    no graph run, compile or fallback at all."""
    off = _run("off")
    assert off["reads"] == [0, 0, 0, {}]
    assert off["items"] == [0, 0, 0, {}]
    assert off["mask_index"] == [0, 0, 0, {}]
    assert off["caller"] is None


def test_an_empty_index_is_a_constant_on_torch_xla_2_9_only(t20, xla_cpu):
    """torch_xla 2.9's IndexByTensors returns full(shape, 0) for an index with no element
    (pytorch/xla#7113): the next size's graph is found compiled. 1.10 gathers."""
    falls = {"aten::nonzero": 1, "aten::histc": 1}
    assert xla_cpu["empty_index"] == [[2, 2, 0, falls], [2, 1, 1, falls]]
    assert t20["empty_index"] == [[2, 2, 0, falls], [2, 2, 0, falls]]
