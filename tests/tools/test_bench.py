"""The benchmark's own logic, without running it: options, the host_reads section's config and
arithmetic, the rehearsal's plan and verdicts, the table, docs/performance.md and the runs it
is written from, the size limits.

``make bench`` itself (minutes of training) is not run here."""

import ast
import glob
import os
import sys

import pytest

from tests.conftest import REPO

BENCH = os.path.join(REPO, "tools", "benchmarks")
sys.path.insert(0, BENCH)

import bench  # noqa: E402
import performance  # noqa: E402
import report  # noqa: E402
import rows  # noqa: E402
import sections  # noqa: E402
from sections import host_reads, overhead, rehearsal  # noqa: E402


def test_options_defaults_quick_and_old_names():
    args = bench.parse_args([])
    assert args.sections == list(sections.NAMES)
    assert args.rehearsal_apis == ["gcu2", "gcu1"] and args.host_reads_apis == ["gcu2", "gcu1"]
    assert (args.host_reads_iters, args.host_reads_interval) == (30, 10)
    quick = bench.parse_args(["--quick", "--overhead-pairs", "2"])
    assert quick.overhead_pairs == 2  # explicit sizes win over --quick
    assert quick.overhead_iters == bench.QUICK["overhead_iters"]
    old = bench.parse_args(["--rehearsal-api", "legacy", "--simcost-apis", "v2,legacy"])
    assert old.rehearsal_apis == ["gcu1"] and old.simcost_apis == ["gcu2", "gcu1"]
    assert bench.parse_args(["--sections", "host_reads, sync_bn"]).sections == [
        "host_reads",
        "sync_bn",
    ]


@pytest.mark.parametrize("argv", [["--sections", "bogus"], ["--host-reads-apis", "gcu3"]])
def test_options_refused(argv, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert "unknown" in capsys.readouterr().err


@pytest.mark.parametrize("defer", [True, False])
def test_host_reads_config_is_the_stock_fcn_config(tmp_path, defer):
    from mmengine.config import Config

    path = tmp_path / "cfg.py"
    path.write_text("\n".join(host_reads.config_lines("/data", 20, 10, defer)) + "\n")
    cfg = Config.fromfile(str(path))
    assert cfg.runner_type == "GCURunner" and "mmgcu" in cfg.custom_imports.imports
    assert cfg.model.backbone.depth == 18 and cfg.model.auxiliary_head.num_classes == 4
    assert cfg.model.backbone.norm_cfg.type == "SyncBN" and cfg.model.pretrained is None
    dataset = cfg.train_dataloader.dataset
    assert dataset.type == "BaseSegDataset" and dataset.data_root == "/data"
    assert "leftImg8bit" not in str(dataset)  # nothing of Cityscapes is left
    assert cfg.train_cfg.max_iters == 20 and cfg.default_hooks.logger.interval == 10
    assert cfg.default_hooks.checkpoint.interval > 20 and cfg.val_dataloader is None
    assert cfg.custom_hooks == [dict(type="HostReadsProbeHook")]
    assert cfg.get("gcu_defer_scalars", True) is defer


def _probe(rank, by_iter, graph_runs, hub="CardMessageHub", api="gcu1", tree=REPO, start=0):
    """A probe report: ``by_iter`` the reads in each iteration (the counter is cumulative)."""
    marks, total = [], start
    for n in by_iter:
        total += n
        marks.append(total)
    reads = marks[-1] - start
    delta = dict(
        host_reads=reads, scalar_reads=0, copies_to_host=reads, graph_runs=graph_runs,
        optimizer_step=graph_runs, unlazy=0,
    )  # fmt: skip
    after = dict(api=api, mmgcu_file=os.path.join(tree, "mmgcu", "__init__.py"))
    after["host_reads"] = marks[-1]
    before = dict(host_reads=start)
    return dict(rank=rank, iters=len(by_iter), delta=delta, before=before, after=after,
                reads_by_iter=marks, message_hub=hub)  # fmt: skip


#: 20 iterations, a log line every 10: a one-time read in the first two, one per log line.
READS = [1, 2, 0, 0, 0, 0, 0, 0, 0, 1] + [0] * 9 + [1]


def test_host_reads_steady_state_and_one_time_reads():
    probes = [_probe(0, READS, 20), _probe(1, READS[:-1] + [3], 20, start=7)]
    result = host_reads.summarize(probes, "gcu1", "mmgcu", 20, 10)
    assert result["per_iter"]["host_reads"] == pytest.approx((5 + 7) / 40)
    assert result["per_iter"]["graph_runs"] == pytest.approx(1.0)
    assert [r["host_reads"] for r in result["per_rank"]] == [5, 7]
    assert result["steady_per_iter"] == pytest.approx((1 + 3) / 20)
    first = [(s["first_interval"], s["iters"], s["reads"]) for s in result["steady"]]
    assert first == [(4, 10, 1), (4, 10, 3)]
    assert host_reads.one_time(result) == "4/4 and 0/0"


def test_host_reads_needs_iterations_after_the_first_interval():
    with pytest.raises(RuntimeError, match="no steady state after 10"):
        host_reads.summarize([_probe(0, [1] * 10, 10), _probe(1, [1] * 10, 10)], "gcu1",
                             "mmgcu", 10, 10)  # fmt: skip


@pytest.mark.parametrize(
    "probes, match",
    [
        ([_probe(0, READS, 20)], "one per rank"),
        ([_probe(0, READS, 20), _probe(1, READS[:-1], 20)], "expected 20"),
        ([_probe(0, READS, 20), _probe(1, READS, 20, hub="MessageHub")], "CardMessageHub"),
        ([_probe(0, READS, 20), _probe(1, READS, 20, api="gcu2")], "on gcu1"),
        ([_probe(0, READS, 20), _probe(1, READS, 20, tree="/elsewhere")], "not this checkout"),
    ],
)
def test_host_reads_refuses_runs_that_are_not_what_they_claim(probes, match):
    with pytest.raises(RuntimeError, match=match):
        host_reads.summarize(probes, "gcu1", "mmgcu", 20, 10)


def test_host_reads_variants_follow_each_generations_overflow_steps(tmp_path):
    from mmengine.config import Config

    assert host_reads.variants("gcu2") == ["mmgcu", "stock", "amp_skip", "amp_zero"]
    assert host_reads.variants("gcu1") == ["mmgcu", "stock", "amp_zero"]
    path = tmp_path / "amp.py"
    path.write_text("\n".join(host_reads.config_lines("/data", 30, 10, True, "zero")) + "\n")
    wrapper = Config.fromfile(str(path)).optim_wrapper
    assert (wrapper.type, wrapper.overflow_step, wrapper.loss_scale) == (
        "AmpOptimWrapper", "zero", "dynamic")  # fmt: skip
    assert wrapper.optimizer.type == "SGD"  # the stock config's optimizer is kept


def test_rehearsal_plan_interleaves_old_and_new():
    assert rehearsal.plan(1, 0, 1) == [["fp32", "amp"]]
    assert rehearsal.plan(1, 3, 1) == [
        ["fp32", "baseline", "amp"],
        ["baseline", "fp32"],
        ["fp32", "baseline"],
    ]
    assert rehearsal.plan(2, 0, 0) == [["fp32"], ["fp32"]]
    assert rehearsal.plan(1, 0, 2) == [["fp32", "amp"], ["fp32", "amp"]]  # amp has a partner


def _run(variant, wall, code=0):
    return dict(variant=variant, wall_s=wall, cpu_s=2 * wall, exit_code=code)


def _results():
    base = dict(tree="/tmp/b", commit="14e0974" + "0" * 33, api="legacy")
    runs = [_run("fp32", 40), _run("baseline", 30), _run("amp", 44)]
    runs += [_run("baseline", 32), _run("fp32", 42), _run("fp32", 41), _run("baseline", 31)]
    gcu1 = rehearsal._summary("gcu1", runs, base)
    gcu2 = rehearsal._summary("gcu2", [_run("fp32", 30), _run("amp", 33, code=1)], None)
    gcu1_probes = [_probe(0, READS, 20), _probe(1, READS, 20)]
    mine = host_reads.summarize(gcu1_probes, "gcu1", "mmgcu", 20, 10)
    stock = host_reads.summarize(
        [_probe(r, [5] * 20, 20, hub="MessageHub") for r in (0, 1)], "gcu1", "stock", 20, 10
    )
    reads = dict(mmgcu=mine, stock=stock, amp_zero=mine)
    reads["passed"] = host_reads._passed(reads, 10)
    gcu2_probes = [_probe(r, READS[:-1] + [2], 20, api="gcu2") for r in (0, 1)]  # 2 a line
    bad = dict(mmgcu=host_reads.summarize(gcu2_probes, "gcu2", "mmgcu", 20, 10), stock=stock)
    bad["amp_skip"] = dict(steady_per_iter=1.1)
    bad["passed"] = host_reads._passed(bad, 10)
    hr = dict(config=host_reads.FCN_CONFIG, ranks=2, iters=20, log_interval=10)
    hr["apis"] = dict(gcu2=bad, gcu1=reads)
    return dict(rehearsal=dict(apis=dict(gcu2=gcu2, gcu1=gcu1)), host_reads=hr)


@pytest.mark.parametrize("api, cards", [("gcu2", "s60:2"), ("gcu1", "t20:2")])
def test_rehearsal_knows_the_simulators_notice(api, cards, python):
    """The section checks each run's log for the simulator's notice of its API: the notice
    as this tree prints it (the baseline commit's 'SIMULATED (legacy API' aside)."""
    notice = python(
        "import mmgcu, torch_gcu",
        MMGCU_SIMULATE=cards,
        MMGCU_SIMULATE_API=api,
        PYTHONPATH=REPO,
    )
    assert rehearsal.simulated_banner(api, old=False) in notice.stderr, notice.stderr
    assert rehearsal.simulated_banner("legacy", old=True) == "SIMULATED (legacy API"


def test_overhead_pairs_alternate_and_the_verdict_is_paired():
    assert [overhead.pair_order(p) for p in range(4)] == ["AB", "BA", "AB", "BA"]

    def run(med):
        return dict(median_s=med, min_s=med * 0.9)

    # every A run 0.5 % dearer than the B run next to it, while the machine slows 10 % a pair
    b = [0.020, 0.022, 0.024, 0.026]
    runs = dict(A=[run(x * 1.005) for x in b], B=[run(x) for x in b])
    out = overhead.ratios(runs, 10, 2)
    assert out["ratio_A_over_B"] == pytest.approx(1.005) and out["passed"] is True
    assert out["unpaired_ratio_A_over_B"] == pytest.approx(1.005)
    runs["A"][1] = run(b[1] * 1.2)  # one pair disturbed does not move the median past 1.01
    assert overhead.ratios(runs, 10, 2)["ratio_A_over_B"] == pytest.approx(1.005)
    runs["A"] = [run(x * 1.02) for x in b]
    assert overhead.ratios(runs, 10, 2)["passed"] is False


def test_rehearsal_verdicts():
    gcu1 = _results()["rehearsal"]["apis"]["gcu1"]
    assert gcu1["median_wall_s"] == 41 and gcu1["baseline_median_s"] == 31
    assert gcu1["new_over_baseline"] == pytest.approx(41 / 31)
    assert gcu1["baseline_passed"] is False and gcu1["passed"] is False  # 1.32 > 1.2
    assert gcu1["cpu_new_over_baseline"] == pytest.approx(82 / 62)
    assert gcu1["amp_over_fp32"] == pytest.approx(44 / 40)  # against round 1's fp32 run
    assert gcu1["pair_ratios"] == pytest.approx([40 / 30, 42 / 32, 41 / 31])
    gcu2 = _results()["rehearsal"]["apis"]["gcu2"]
    assert gcu2["all_exit_0"] is False and gcu2["passed"] is False


INFO = dict(
    date="2026-11-23T20:00:00+00:00", cpu_model="CPU", usable_cpus=2, python="3.11.7",
    torch="2.13.0", mmengine="0.10.7", mmsegmentation="1.2.2", git_commit="abc1234def",
    git_dirty=True, load1_at_start=0.5, python_executable="/home/me/mmgcu/.venv/bin/python",
    repo="/home/me/mmgcu",
)  # fmt: skip


def _report(tmp_path, argv, results, errors=None, name="bench.json", **info):
    """A bench report of ``results`` written as bench.py writes it; its path."""
    args = bench.parse_args(argv + ["--out", "/home/me/mmgcu/bench_results/bench.json"])
    loads = dict(host_reads=dict(load1_before=0.5, load1_after=1.5, section_s=1.0))
    out = report.build(dict(INFO, **info), args, results, loads, errors or {}, {}, 1.0)
    path = str(tmp_path / name)
    report.write(out, path)
    return path, out


def test_table_and_json(tmp_path):
    errors = {"sync_bn": "RuntimeError: rank 1 failed"}
    _, out = _report(tmp_path, ["--sections", "rehearsal,host_reads"], _results(), errors)
    table = {(r["section"], r["measurement"]): r for r in out["table"]}
    steady = "card reads / iteration after the first log interval, mmgcu [{}]"
    mmgcu_gcu2 = table[("5 host reads", steady.format("gcu2"))]
    assert (mmgcu_gcu2["value"], mmgcu_gcu2["verdict"]) == (pytest.approx(0.2), "FAIL")
    assert table[("5 host reads", steady.format("gcu1"))]["verdict"] == "PASS"
    amp = table[
        ("5 host reads", "  --amp, overflow_step='skip', after the first log interval [gcu2]")
    ]
    assert (amp["value"], amp["target"], amp["verdict"]) == (1.1, "info", "")
    assert table[("6 SyncBN", "ERROR (see JSON)")]["verdict"] == "FAIL"
    assert out["passed"] is False
    assert report.format_table([tuple(r.values()) for r in out["table"]]).count("\n") > 10


def test_the_doc_names_each_run_and_keeps_no_machine_path(tmp_path):
    errors = {"sync_bn": "RuntimeError: rank 1 failed"}
    argv = ["--sections", "rehearsal,host_reads", "--check"]
    path, _ = _report(tmp_path, argv, _results(), errors)
    kept = performance.keep(path, str(tmp_path / "runs"))
    with open(kept) as f:
        assert "/home/me" not in f.read()  # the machine's paths stay on the machine
    doc = tmp_path / "performance.md"
    assert performance.write(str(doc), str(tmp_path / "runs")) == []
    text = doc.read_text()
    assert "/home/me" not in text
    run = "### 2026-11-23, commit abc1234 (uncommitted changes): "
    assert run + "`bench.py --sections rehearsal,host_reads --check`" in text
    assert "load average 0.5 at the start, 0.5 to 1.5 around the sections; 1 s in all." in text
    assert "Failed, so not shown: sync_bn." in text
    assert "**0.20** vs 5.00 / **0.10** vs 5.00 | 0.1 (one per log line) |" in text
    assert "| 4/4 and 0/0 / 4/4 and 0/0 |" in text
    assert "gcu2 `skip` 1.10, gcu1 `zero` 0.10 | `zero`: 0.1 |" in text
    assert "41.0 s vs 31.0 s: ratio **1.32** (pairs 1.31–1.33; CPU time 1.32)" in text
    # The sections this run did not measure keep the recorded run's rows, under its name.
    assert "### 2026-11-28, commit c8f64c4: `make bench BENCH_ARGS=--check`" in text
    assert "26.4 ms vs 26.5 ms: ratio **0.999**" in text  # overhead, recorded
    assert "| one-time reads per rank before that" not in text  # host_reads: the new run's
    assert text.index("26.4 ms vs 26.5 ms") < text.index(run)  # in the sections' order
    assert performance.MARK not in text and "## What the figures mean" in text


def test_a_newer_run_replaces_a_section_and_a_quick_run_is_not_kept(tmp_path):
    runs = str(tmp_path / "runs")
    old, _ = _report(tmp_path, ["--sections", "host_reads"], _results(), name="old.json")
    performance.keep(old, runs)
    newer = dict(date="2026-11-24T20:00:00+00:00", git_commit="fed4321abc", git_dirty=False)
    new, _ = _report(tmp_path, ["--sections", "host_reads"], _results(), name="new.json", **newer)
    performance.keep(new, runs)
    quick, _ = _report(tmp_path, ["--quick"], _results(), name="quick.json")
    assert performance.keep(quick, runs) is None
    doc = str(tmp_path / "performance.md")
    (unused,) = performance.write(doc, runs)
    assert "20261123T200000-" in unused  # every section of it is newer elsewhere
    with open(doc) as f:
        text = f.read()
    assert "### 2026-11-24, commit fed4321: `bench.py --sections host_reads`" in text
    assert "2026-11-23" not in text
    assert performance.main(["--add", new, "--runs", runs, "--out", doc]) == 0
    assert not os.path.exists(unused)  # --add removes what no section shows


def test_graphs_and_padding_rows():
    from sections import graphs

    runs = []
    for pair, (off, kept) in enumerate([(43.5, 44.6), (35.2, 38.6)]):
        walls = dict(off=off, t20=kept)
        runs += [dict(profile=p, wall_s=walls[p], exit_code=0) for p in graphs.order(pair)]
    (row,) = rows.graphs(graphs.summary(runs))
    assert "kept / off 44.6 / 43.5, 38.6 / 35.2 s: ratio **1.06** (pairs 1.03–1.10)" in row
    metrics = ("aAcc", "mIoU", "mAcc")
    result = dict(sizes=[[48, 64], [96, 96]], images=8, buckets=[[32, 48]])
    result.update(own_size=dict(zip(metrics, (93.78, 83.29, 88.88))))
    result.update(padded=dict(zip(metrics, (94.41, 84.93, 90.2))))
    result["control"] = dict(difference=dict(zip(metrics, (0.0, 0.0, 0.0))))
    padded, control = rows.padding(result)
    assert "8 images of 2 sizes (48 to 96 px a side)" in padded
    assert "| mIoU 83.29 / 84.93, aAcc 93.78 / 94.41, mAcc 88.88 / 90.20 | info |" in padded
    assert "the same on 4 images" in control and "mIoU +0.00" in control


def test_the_shipped_doc_is_what_the_kept_runs_write(tmp_path):
    """docs/performance.md is written by the tool from the committed runs, not by hand."""
    doc = tmp_path / "performance.md"
    performance.write(str(doc))
    with open(os.path.join(REPO, "docs", "performance.md"), encoding="utf-8") as f:
        assert f.read() == doc.read_text(encoding="utf-8"), "run tools/benchmarks/performance.py"


def test_simulator_cost_rows_give_each_api_its_own_range():
    def api(step_cpu, step_card, small, conv):
        ops = {f"op{i}": dict(overhead_us=us) for i, us in enumerate(small)}
        ops["conv2d 1x16x32x32"] = dict(overhead_us=conv)
        m = dict(cpu=step_cpu, card=step_card, ratio=step_card / step_cpu)
        return dict(step_median_s=m, ops=ops)

    step, per_op = rows.simcost(
        dict(gcu2=api(0.010, 0.012, [0.8, 1.7], 3.1), gcu1=api(0.010, 0.011, [0.9, 1.2], 1.3))
    )
    assert "10.0 ms vs 12.0 ms (1.20×) / 10.0 ms vs 11.0 ms (1.10×)" in step
    assert "| +0.8 to +1.7 µs; +3.1 µs / +0.9 to +1.2 µs; +1.3 µs |" in per_op


def test_no_file_over_400_lines_no_function_over_40():
    for path in glob.glob(os.path.join(BENCH, "**", "*.py"), recursive=True):
        with open(path) as f:
            text = f.read()
        assert len(text.splitlines()) <= 400, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno < 40, f"{path}: {node.name}"


def test_graphs_pairs_alternate_and_the_verdict_is_the_median_ratio():
    from sections import graphs

    assert [graphs.order(p) for p in range(3)] == [("off", "t20"), ("t20", "off"), ("off", "t20")]

    def runs(kept_walls, code=0):
        out = []
        for pair, kept in enumerate(kept_walls):
            walls = dict(off=40.0, t20=kept)
            out += [dict(profile=p, wall_s=walls[p], exit_code=code) for p in graphs.order(pair)]
        return out

    result = graphs.summary(runs([42.0, 60.0, 43.0]))  # one pair disturbed
    assert result["pair_ratios"] == pytest.approx([1.05, 1.5, 1.075])
    assert result["ratio"] == pytest.approx(1.075) and result["passed"] is True
    assert graphs.summary(runs([45.0, 46.0, 44.4]))["passed"] is False  # 1.11 median
    assert graphs.summary(runs([40.0] * 3, code=1))["passed"] is False
    assert graphs.rows(result)[0][-1] == "PASS"


def test_padding_reads_the_last_test_metrics_of_the_log():
    from sections import padding

    log = "\n".join(
        [
            "11/28 18:31:59 - mmengine - INFO - Iter(test) [4/48]    eta: 0:00:01",
            "11/28 18:32:01 - mmengine - INFO - Iter(test) [48/48]    aAcc: 93.1000  "
            "mIoU: 81.0300  mAcc: 88.9000  data_time: 0.0024  time: 0.4436",
        ]
    )
    assert padding.metrics_of(log) == dict(aAcc=93.1, mIoU=81.03, mAcc=88.9)
    with pytest.raises(RuntimeError, match="no test metrics"):
        padding.metrics_of("Iter(test) [4/48]    eta: 0:00:01")
    result = dict(images=48, own_size=dict(aAcc=1.0, mIoU=2.0, mAcc=3.0))
    result["padded"] = dict(aAcc=1.5, mIoU=1.0, mAcc=3.0)
    result["difference"] = dict(aAcc=0.5, mIoU=-1.0, mAcc=0.0)
    result["control"] = dict(difference=dict(aAcc=0.0, mIoU=0.0, mAcc=0.0))
    assert padding.rows(result)[1][1] == "2.00 / 1.00 (-1.00)"
    assert padding.rows(result)[3][1] == "+0.00 / +0.00 / +0.00"
