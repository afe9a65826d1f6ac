"""The simulated T20 card against a real XLA runtime: the same programs, the same graphs.

Each program of ``programs.py`` runs on torch_xla 2.9 on the CPU (the oracle, in the
environment ``make conformance`` builds: ``.venv-xla``) and on one simulated card of this
environment's torch (torch 2.13 on the main leg, torch 1.10 on the T20 leg). With the
``xla-cpu`` lowering profile (torch_xla 2.9's op lists and CPU-device conditions) the
simulated card must run the same graphs, compile the same graphs and fall back to the CPU
on the same ops, step by step. With the ``t20`` profile (torch_xla 1.10's lists, which the
T20 runs) it may differ from the oracle only by the ops the profile assumes lowered on a
T20 (torch_xla's TPU-only resize lowerings, which fall back on a CPU device): fewer graph
runs, never more, and no other fallback; and where torch_xla 1.10 itself differs from 2.9
(``T20_DIFFERS``: the count the T20 profile gives is asserted instead).

``make conformance`` runs the oracle once (``MMGCU_ORACLE_RESULTS`` names its output) and
this module on both legs, with ``MMGCU_CONFORMANCE=required``: a missing oracle is then a
failure, not a skip. ``make test`` leaves this folder out (the oracle's environment is
7 GB and a build of mmcv of its own).
"""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

from .programs import PROGRAMS

ORACLE_PYTHON = os.environ.get("MMGCU_ORACLE_PYTHON") or os.path.join(
    REPO, ".venv-xla", "bin", "python"
)
RESULTS = os.environ.get("MMGCU_ORACLE_RESULTS")
REQUIRED = os.environ.get("MMGCU_CONFORMANCE") == "required"
#: What the T20 profile lowers and torch_xla on a CPU device does not (aten_xla_type.cpp:
#: "Only the XLA TPU backend for now implements the CustomCall required by our lowering").
ASSUMED_LOWERED_ON_T20 = {"aten::upsample_bilinear2d_backward", "aten::upsample_nearest2d_backward"}


def _available() -> bool:
    return bool(RESULTS and os.path.isfile(RESULTS)) or os.path.isfile(ORACLE_PYTHON)


pytestmark = pytest.mark.skipif(
    not REQUIRED and not _available(),
    reason="no torch_xla here: make conformance builds .venv-xla and runs this suite",
)


def _parse(text: str) -> dict:
    rows = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return {row["program"]: row["result"] for row in rows}


def _run(python: str, backend: str, **env) -> dict:
    proc = subprocess.run(
        [python, "-m", "tests.conformance.run", backend],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, **env},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return _parse(proc.stdout)


@pytest.fixture(scope="module")
def oracle() -> dict:
    if RESULTS:
        with open(RESULTS) as f:
            return _parse(f.read())
    assert os.path.isfile(ORACLE_PYTHON), f"no oracle environment at {ORACLE_PYTHON}"
    return _run(ORACLE_PYTHON, "xla", PJRT_DEVICE="CPU")


@pytest.fixture(scope="module")
def simulated() -> dict:
    return _run(sys.executable, "sim", MMGCU_SIM_XLA="xla-cpu")


@pytest.fixture(scope="module")
def on_t20() -> dict:
    return _run(sys.executable, "sim", MMGCU_SIM_XLA="t20")


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_the_simulated_card_runs_and_compiles_the_graphs_xla_does(program, oracle, simulated):
    assert program in oracle, f"the oracle did not run {program}"
    assert simulated[program] == oracle[program]


def _steps(result):
    """A program's counted parts: its steps, a loop's steps and validation, or one count."""
    if isinstance(result, dict) and "steps" in result:
        return result["steps"] + [result["val"]]
    return result if isinstance(result, list) else [result]


#: Programs where torch_xla 1.10, which the T20 profile follows, differs from 2.9 by design.
T20_DIFFERS = {
    # 2.9's index by an empty index is a constant (pytorch/xla#7113); 1.10 gathers from the
    # input, whose shape is in the graph: each size compiles its graph
    "empty_index": [dict(runs=2, compiles=2, fallbacks={"aten::histc": 1, "aten::nonzero": 1})] * 4,
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_the_t20_differs_only_by_the_ops_it_assumes_lowered(program, oracle, on_t20):
    if program in T20_DIFFERS:
        assert on_t20[program] == T20_DIFFERS[program]
        return
    for xla, t20 in zip(_steps(oracle[program]), _steps(on_t20[program])):
        assumed = {k: v for k, v in xla["fallbacks"].items() if k in ASSUMED_LOWERED_ON_T20}
        others = {k: v for k, v in xla["fallbacks"].items() if k not in ASSUMED_LOWERED_ON_T20}
        assert t20["fallbacks"] == others
        if assumed:
            assert t20["runs"] < xla["runs"]
        else:
            assert t20 == xla


def test_the_programs_exercise_what_the_suite_claims(oracle):
    """The oracle does see cuts, fallbacks and recompiles where the programs put them: the
    suite compares more than programs that run one graph."""
    assert oracle["with_accuracy"][1]["fallbacks"] == {"aten::nonzero": 2}
    assert all(step["compiles"] == 1 for step in oracle["with_accuracy"][1:])
    assert oracle["with_avg_non_ignore"][1]["fallbacks"]["aten::_local_scalar_dense"] == 1
    assert [step["compiles"] for step in oracle["static_accuracy"]][2:] == [0, 0]
    # the metric on the card compiles more than the prediction on the host, and images of
    # one size fewer than images of many
    assert oracle["val_iou_on_card"]["compiles"] > oracle["val_host"]["compiles"] > 1
    assert oracle["val_iou_on_card_one_size"]["compiles"] < oracle["val_iou_on_card"]["compiles"]
    assert [step["compiles"] for step in oracle["empty_index"]] == [2, 1, 1, 1]
