"""``mmgcu env`` in fresh processes: simulated cards of both generations, no GCU, efsmi only."""

import json
import os
import stat
import sys
from importlib.metadata import version

import torch

from mmgcu.cli.env import format_env
from tests.cli.conftest import mmgcu


def report(proc):
    """The ``- key: value`` lines of a successful ``mmgcu env``, as a dict."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = {}
    for line in proc.stdout.splitlines():
        assert line.startswith("- "), line
        key, _, value = line[2:].partition(":")
        info[key] = value.strip()
    return info


def test_simulated_gcu2_eight_cards():
    info = report(mmgcu("env", MMGCU_SIMULATE=8))
    assert list(info)[0] == "torch_gcu simulator"  # first, so nobody mistakes it for a T20
    assert info["torch_gcu simulator"].startswith("SIMULATED (S60: gcu2 API, 8 cards)")
    assert info["torch_gcu"].startswith("SIMULATED torch_gcu") and "2.x" in info["torch_gcu"]
    assert info["torch"] == torch.__version__
    for name in ("mmengine", "mmcv"):
        assert info[name] == version(name)
    assert info["mmseg"] == version("mmsegmentation")
    assert info["mmcv ops compiled"].startswith("yes")
    assert info["cards"] == "8"
    assert [k for k in info if k.startswith("GCU ")] == [f"GCU {i}" for i in range(8)]
    assert info["GCU 3"] == "S60 (simulated, card 3)"
    assert info["cards for launchers"].startswith("8 (MMGCU_SIMULATE=8")
    assert info["ECCL"] == "available"
    assert info["process groups"] == "cpu:gloo,gcu:eccl"
    assert info["TOPS_VISIBLE_DEVICES"] == "unset"
    assert info["ECCL variables"] == "none set"
    assert info["Python executable"] == sys.executable


def test_simulated_t20_with_visible_devices_and_eccl_variables():
    """MMGCU_SIMULATE=t20 is a T20 server: 8 cards on torch_gcu 1.x, whatever the torch."""
    info = report(
        mmgcu(
            "env",
            MMGCU_SIMULATE="t20",
            TOPS_VISIBLE_DEVICES="0,1,2,3",
            ECCL_PROTO="LL",
            ECCL_SHM_DISABLE="1",
        )
    )
    assert info["torch_gcu simulator"].startswith("SIMULATED (T20: gcu1 API, 4 cards)")
    assert "1.x" in info["torch_gcu"]
    assert info["GCU 0,1,2,3"] == "T20 (simulated)"
    assert info["cards"] == "4"
    assert info["cards for launchers"] == "4 (TOPS_VISIBLE_DEVICES=0,1,2,3)"
    assert info["TOPS_VISIBLE_DEVICES"] == "0,1,2,3"
    assert info["process groups"] == "torch.distributed gloo_eccl + torch_gcu.distributed eccl"
    assert info["ECCL"] == "available"
    assert info["ECCL variables"] == "ECCL_PROTO=LL, ECCL_SHM_DISABLE=1"


def test_json_parses():
    proc = mmgcu("env", "--json", MMGCU_SIMULATE=8, ECCL_ALGO="RING")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["cards"] == 8
    assert data["ECCL"] == "available"
    assert data["ECCL variables"] == {"ECCL_ALGO": "RING"}
    assert data["torch_gcu simulator"].startswith("SIMULATED (S60: gcu2 API, 8 cards)")


def test_missing_eccl_is_reported():
    info = report(mmgcu("env", MMGCU_SIMULATE=2, MMGCU_SIMULATE_ECCL=0))
    assert info["ECCL"].startswith("NOT available: torch_gcu is imported but")
    assert info["cards"] == "2"


def test_without_torch_gcu_falls_back_to_cpu():
    info = report(mmgcu("env"))
    assert "torch_gcu simulator" not in info
    assert info["torch_gcu"].startswith("not found: torch_gcu is not importable")
    assert info["device"].startswith("cpu (fallback)")
    assert "running on the CPU" in info["device"]
    assert info["cards"].startswith("0 GCU cards")
    assert info["ECCL"].startswith("not applicable")
    assert info["TopsRider / driver"].startswith("not found")


FAKE_EFSMI = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "efsmi version 9.9.9 (test)"; exit 0; fi
echo "* 0      T20                 | 10.19.3         | 00:3d:0.0  Enable        *"
echo "* 30C    Sleep   48.0W  300W | 32G      Disable|   0.0%     W28001210504  *"
echo "* 1      T20                 | 10.19.3         | 00:3e:0.0  Enable        *"
echo "* 31C    Sleep   48.0W  300W | 32G      Disable|   0.0%     W28001210505  *"
"""


def test_efsmi_is_the_fallback_without_torch_gcu(tmp_path):
    efsmi = tmp_path / "efsmi"
    efsmi.write_text(FAKE_EFSMI)
    efsmi.chmod(efsmi.stat().st_mode | stat.S_IEXEC)
    info = report(mmgcu("env", PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}"))
    assert info["TopsRider / driver"] == "efsmi --version: efsmi version 9.9.9 (test)"
    assert info["cards"] == "2 listed by efsmi, but torch_gcu cannot use them"
    assert info["efsmi cards"] == "0: T20, 1: T20"
    assert info["cards for launchers"] == "2 (efsmi)"


def test_format_aligns_values():
    text = format_env({"a": "1", "longer key": {"X": "y"}, "c": 3})
    assert text.splitlines() == ["- a:          1", "- longer key: X=y", "- c:          3"]
