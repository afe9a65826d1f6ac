"""``make demo``'s run: the demo config on 8 simulated cards learns (mIoU far above the
background-only baseline), and tools/plot_demo.py draws it."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.conftest import one_worker
from tests.tools.conftest import TOOLS, script_env

sys.path.insert(0, TOOLS)
import plot_demo  # noqa: E402


def test_background_baseline_is_iou_metric_of_all_background(tmp_path):
    labels = np.zeros((4, 4), np.uint8)
    labels[:2, :1] = 1  # 2 of 16 pixels class 1, 2 of 16 class 2, class 3 absent
    labels[3, 2:] = 2
    Image.fromarray(labels).save(tmp_path / "a.png")
    # IoU of background 12/16, classes 1 and 2 zero, class 3 left out (not in the data).
    assert plot_demo.background_miou([str(tmp_path / "a.png")], 4) == pytest.approx(25.0)


def test_curves_from_logged_scalars(tmp_path):
    run = tmp_path / "20260101_000000" / "vis_data"
    run.mkdir(parents=True)
    records = [dict(loss=1.3, step=2), dict(mIoU=40.0, aAcc=80.0, step=5)]
    records += [dict(loss=0.4, step=4), dict(mIoU=80.0, aAcc=95.0, step=10)]
    (run / "scalars.json").write_text("".join(json.dumps(r) + "\n" for r in records))
    train, val = plot_demo.read_scalars(str(tmp_path))
    assert [r["step"] for r in train] == [2, 4] and [r["mIoU"] for r in val] == [40.0, 80.0]
    plot_demo.plot_curves(train, val, 16.0, str(tmp_path / "curves.png"))
    assert Image.open(tmp_path / "curves.png").size[0] > 500


@pytest.mark.e2e
@pytest.mark.long
@one_worker("eight_card_run")
def test_demo_learns_on_8_simulated_t20_cards(eight_card_run):
    """make demo's command on the main leg's 8-card run (``eight_card_run``: the demo
    config, tools/dist_train.sh, ``MMGCU_SIMULATE=t20``: the T20's generation, torch_gcu
    1.x, xla:N; the probe hook of the 8-card tests only records; test_train_8cards checks
    its warnings come once, not once per card); then tools/plot_demo.py on its work folder."""
    out, work = eight_card_run["out"], eight_card_run["work"]
    assert eight_card_run["code"] == 0, out[-5000:]
    assert out.count("torch_gcu is SIMULATED (T20: the torch_gcu 1.x API, xla:N") == 1
    assert "rank 7 on " in out and "xla:7" in out, out[-5000:]
    assert "UserWarning: The draw is" not in out
    proc = subprocess.run(
        [sys.executable, os.path.join(TOOLS, "plot_demo.py"), work],
        env=script_env(),
        cwd=os.path.dirname(work),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = re.search(r"validation mIoU ([\d.]+) .* scores ([\d.]+)", proc.stdout)
    assert found, proc.stdout
    miou, baseline = float(found.group(1)), float(found.group(2))
    assert baseline < 20 and miou > 70, proc.stdout  # measured: ~85 vs ~16
    for name in ("curves.png", "predictions.png"):
        assert os.path.exists(os.path.join(work, name))
