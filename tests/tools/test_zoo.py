"""``make zoo``'s own logic, without rehearsing (an hour on 2 cores): the family list, the
table of both legs, which failures it puts outside mmgcu and how it compares losses."""

import json
import os
import sys

from tests.conftest import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))

import zoo  # noqa: E402


def table(tmp_path, main, t20) -> str:
    """The markdown ``tools/zoo.py table`` writes from the two legs' rows."""
    paths = []
    for leg, rows in (("main", main), ("t20", t20)):
        path = tmp_path / f"{leg}.json"
        path.write_text(json.dumps(dict(leg=leg, label=zoo.LEGS[leg][1], rows=rows)))
        paths.append(str(path))
    out = tmp_path / "zoo.md"
    assert zoo.main(["table", *paths, "--out", str(out)]) == 0
    return out.read_text()


def test_every_family_names_a_stock_config_of_mmseg():
    import mmseg

    root = os.path.join(os.path.dirname(mmseg.__file__), ".mim", "configs")
    for family, (config, needs) in zoo.FAMILIES.items():
        assert os.path.isfile(os.path.join(root, config)), family
        assert config.split("/")[0] == family
        assert needs in (None, "mmpretrain", "mmdet")
    assert os.path.isfile(os.path.join(REPO, zoo.DINOV2[1]))
    assert not set(zoo.LEFT_OUT) & set(zoo.FAMILIES)


def row(family, result="passed", losses=(1.0, 2.0), **extra):
    fields = dict(family=family, config=f"{family}/{family}.py", result=result, seconds=10.0)
    fields.update(losses=list(losses), phase=None, reason=None, fix=None)
    fields.update(extra)
    return fields


def test_the_table_compares_losses_and_names_who_fails(tmp_path):
    main = [
        row("fcn"),
        row("drift", losses=(1.0, 2.001)),
        row("kernels", losses=(1.0, 2.001), plain=dict(losses=[3.0, 4.001])),
        row("ours", losses=(1.0, 2.001), plain=dict(losses=[3.0, 4.0])),
        row("bisenetv2", losses=(10.08398, 13.84599), amp="float16"),
        row("cgnet", "failed", (), phase="train", reason="IndexError: index 255 is out of bounds"),
        row("mask2former"),
        row("emanet"),
        row("dinov2", "not run", (), reason=zoo.WHY_NOT_HERE["mmpretrain"]),
        row("dcn", "failed", (), phase="train", reason="RuntimeError: x_impl", fix="do y"),
    ]
    t20 = [
        row("fcn"),
        row("drift"),
        row("kernels", plain=dict(losses=[3.0, 4.0])),
        row("ours", plain=dict(losses=[3.0, 4.0])),
        row("bisenetv2", losses=(10.08365, 13.82712), amp="float16"),
        row("cgnet", "failed", (), phase="train", reason="IndexError: index 255 is out of bounds"),
        row("mask2former"),
        row(
            "emanet",
            "failed",
            (),
            phase="train",
            reason="RuntimeError: ProcessGroupGloo::allreduce: unsupported device type xla",
            fix="leave env_cfg.dist_cfg.backend unset",
        ),
        row("dinov2", changed="1 image per card"),
        row("dcn"),
    ]
    text = table(tmp_path, main, t20)
    lines = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}
    assert lines["fcn"].endswith("| yes |")
    assert lines["drift"].endswith("| **no** |")  # 5e-4 apart
    # the torch builds' own difference, from the plain CPU, or mmgcu's where those agree
    assert lines["kernels"].endswith(
        "| no, nor the plain CPU: 3.00000 / 4.00100 ; 3.00000 / 4.00000 |"
    )
    assert lines["ours"].endswith("| **no**; the plain CPU agrees: 3.00000 / 4.00000 |")
    assert lines["bisenetv2"].endswith("| within 1e-2 (AMP) |")
    assert "| fails in mmseg (train) | fails in mmseg (train) |" in lines["cgnet"]
    assert lines["mask2former"].endswith(
        "| passed (10 s) | passed (10 s) | 1.00000 / 2.00000 ; 1.00000 / 2.00000 | yes |"
    )
    # A gloo group's refusal of a card tensor is mmgcu's to fix (gloo_eccl), not a limit.
    assert "| passed (10 s) | **failed** (train) |" in lines["emanet"]
    assert "| not run | passed (10 s) |" in lines["dinov2"]
    assert "| **failed** (train) | passed (10 s) |" in lines["dcn"]
    assert "Outside mmgcu (fails in mmseg): mmseg 1.2.2's CrossEntropyLoss" in text
    assert "torch_gcu 1.x limit" not in text
    assert ". Fix: leave env_cfg.dist_cfg.backend unset" in text
    assert ". Fix: do y" in text
    assert "mmpretrain is not importable in this environment" in text
    assert "- **dinov2**: 1 image per card" in text


def test_the_graph_table_shows_the_lazy_legs_graphs_and_cuts(tmp_path):
    graph = dict(
        train=dict(
            runs_first=3,
            runs_later=2.0,
            compiles_later=0,
            cuts=[dict(what="aten::nonzero", cause="fallback", caller="head.py:12", per_step=1.0)],
        ),
        val=dict(compiles=5, images=8, input_shapes=6, runs_per_image=1.0, cuts=[]),
        changes=["FCNHead: accuracy on the card"],
        stalls=[dict(what="a training step runs 2.0 graphs", cost="", fix="")],
    )
    main = [row("fcn")]
    t20 = [row("fcn", graph=zoo.graph_row(graph))]
    text = table(tmp_path, main, t20)
    assert f"## The lazy graph, {zoo.LEGS['t20'][1]}" in text
    assert f"## The lazy graph, {zoo.LEGS['main'][1]}" not in text  # S60 cards keep no graph
    assert "| fcn | 2.0 | 0 | 5 / 8 / 6 | 1.0 | aten::nonzero (fallback) at head.py:12 |" in text
    assert zoo.graph_row(None) is None


def test_the_reasons_name_no_machine_path_and_each_paragraph_once(tmp_path):
    venv = "/opt/someone/.venv-t20/lib/python3.8/site-packages"
    checkout = "/srv/ci/mmgcu"
    failed = dict(phase="train", fix="do y")
    main = [
        row("cgnet", "failed", (), phase="train", reason="IndexError: index 255 is out of bounds"),
        row(
            "dcn",
            "failed",
            (),
            reason=f"x_impl\nmmgcu: {venv}/mmdet/utils/dist_utils.py:64",
            **failed,
        ),
        row("psa", "failed", (), reason=f"y_impl at {checkout}/mmgcu/model/a.py:3", **failed),
        row("convnext", "not run", (), reason=zoo.WHY_NOT_HERE["mmpretrain"]),
        row("poolformer", "not run", (), reason=zoo.WHY_NOT_HERE["mmpretrain"]),
    ]
    t20 = [
        row("cgnet", "failed", (), phase="train", reason="IndexError: index 255 is out of bounds"),
        row("dcn"), row("psa"), row("convnext"), row("poolformer"),
    ]  # fmt: skip
    paths = []
    for leg, rows in (("main", main), ("t20", t20)):
        path = tmp_path / f"{leg}.json"
        results = dict(leg=leg, label=zoo.LEGS[leg][1], rows=rows, repo=checkout)
        path.write_text(json.dumps(results))
        paths.append(str(path))
    out = tmp_path / "zoo.md"
    assert zoo.main(["table", *paths, "--out", str(out)]) == 0
    text = out.read_text()
    assert venv not in text and checkout not in text and "/opt/someone" not in text
    assert "mmgcu: site-packages/mmdet/utils/dist_utils.py:64" in text
    assert "y_impl at mmgcu/model/a.py:3" in text  # the checkout's own file, repo-relative
    reasons = text.split("## Why a row did not pass")[1].split("\n## ")[0]
    assert "- **cgnet**, S60 and T20: IndexError: index 255 is out of bounds (note 1)" in reasons
    assert "- **convnext**, S60: not run (note 3)" in reasons
    assert "- **poolformer**, S60: not run (note 3)" in reasons
    for note in ("Outside mmgcu (fails in mmseg)", "Fix: do y", zoo.WHY_NOT_HERE["mmpretrain"]):
        assert reasons.count(note) == 1, note
    assert "\n  mmgcu: site-packages/" in reasons  # a reason's second line stays in its item


def test_short_paths():
    home = os.path.expanduser("~")
    text = f"at /x/y/lib/python3.8/site-packages/mmseg/a.py:1 and '{home}/data/b.py'"
    assert zoo.short_paths(text) == "at site-packages/mmseg/a.py:1 and '~/data/b.py'"
    assert zoo.short_paths(f"{REPO}/tools/zoo.py", [REPO]) == "tools/zoo.py"
    assert (
        zoo.short_paths("/usr/lib/python3/dist-packages/torch/x.py") == "dist-packages/torch/x.py"
    )


def test_the_runs_line_names_the_run_of_each_re_run_family():
    leg = dict(
        leg="t20",
        run="2026-11-29 04:30 UTC, commit b",
        rows=[
            dict(family="ann", run="2026-11-29 03:01 UTC, commit a"),
            dict(family="apcnet", run="2026-11-29 03:01 UTC, commit a"),
            dict(family="dpt", run="2026-11-29 04:30 UTC, commit b"),
        ],
    )
    assert zoo.runs_of(leg) == (
        "t20 2026-11-29 03:01 UTC, commit a (dpt re-run 2026-11-29 04:30 UTC, commit b)"
    )
    # Rows of a file written before rows kept their run take the file's.
    assert zoo.runs_of(dict(leg="main", run="R", rows=[dict(family="ann")])) == "main R"
