"""Counting cards from TOPS_VISIBLE_DEVICES, the simulator and efsmi, without a card."""

import subprocess
from unittest import mock

import pytest

from mmgcu.launch import cards

EFSMI_CLASSIC = """\
--------------------------------------------------------------------------------
--------------------- Enflame System Management Interface ----------------------
--------------------------------------------------------------------------------

*******************************************************************************
* EFSMI   V1.6.0                             Driver Ver: 1.6.0                *
*******************************************************************************
*-----------------------------------------------------------------------------*
* DEV    NAME                | FW VER          | BUS-ID      ECC              *
* TEMP   Lpm   Pwr(Usage/Cap)| Mem    DEV-Util | vGCU    SN                   *
*-----------------------------------------------------------------------------*
* 0      T20                 | 10.19.3         | 00:3d:0.0  Enable        *
* 30C    Sleep   48.0W  300W | 32G      Disable|   0.0%     W28001210504  *
*-----------------------------------------------------------------------------*
* 1      T20                 | 10.19.3         | 00:3e:0.0  Enable        *
* 31C    Sleep   47.0W  300W | 32G      Disable|   0.0%     W28001210505  *
*-----------------------------------------------------------------------------*
"""

EFSMI_TABLE = """\
+-----------------------------------------------------+
| DEV  NAME   | FW VER  | BUS-ID    | ECC    |
| TEMP Lpm    | Mem     | DEV-Util  | SN     |
|=====================================================|
| 0    T20    | 10.19.3 | 00:3d:0.0 | Enable |
| 35C  Sleep  | 32G     | 0.0%      | W2800  |
| 1    T20    | 10.19.3 | 00:3e:0.0 | Enable |
| 36C  Sleep  | 32G     | 0.0%      | W2801  |
| 2    S60    | 1.2.0   | 00:3f:0.0 | Enable |
| 37C  Sleep  | 48G     | 0.0%      | W2802  |
+-----------------------------------------------------+
"""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in cards.VISIBLE_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("MMGCU_SIMULATE", raising=False)


@pytest.fixture
def no_efsmi(monkeypatch):
    which = mock.Mock(return_value=None)
    monkeypatch.setattr(cards.shutil, "which", which)
    return which


@pytest.fixture
def efsmi(monkeypatch):
    """An installed efsmi; set ``.return_value`` / ``.side_effect`` of the returned run."""
    monkeypatch.setattr(cards.shutil, "which", lambda name: f"/usr/bin/{name}")
    run = mock.Mock(return_value=subprocess.CompletedProcess(["efsmi"], 0, EFSMI_CLASSIC, ""))
    monkeypatch.setattr(cards.subprocess, "run", run)
    return run


# -- TOPS_VISIBLE_DEVICES -------------------------------------------------------


def test_visible_devices_unset():
    assert cards.visible_devices() is None


@pytest.mark.parametrize(
    "value, ids",
    [
        ("0,1,2", ["0", "1", "2"]),
        (" 3 , 5 ", ["3", "5"]),
        ("GCU-2f1a,DRS-0b3c", ["GCU-2f1a", "DRS-0b3c"]),
        ("0,,1,", ["0", "1"]),
        ("", []),
    ],
)
def test_visible_devices_parsing(monkeypatch, value, ids):
    monkeypatch.setenv("TOPS_VISIBLE_DEVICES", value)
    assert cards.visible_devices() == ids


def test_count_from_visible_devices_skips_efsmi(monkeypatch, no_efsmi):
    monkeypatch.setenv("TOPS_VISIBLE_DEVICES", "GCU-a,GCU-b,DRS-c")
    assert cards.count_cards() == (3, "TOPS_VISIBLE_DEVICES=GCU-a,GCU-b,DRS-c")
    no_efsmi.assert_not_called()


def test_empty_visible_devices_means_no_cards(monkeypatch, efsmi):
    monkeypatch.setenv("TOPS_VISIBLE_DEVICES", "")
    assert cards.count_cards() == (0, "TOPS_VISIBLE_DEVICES is set but empty (no card is visible)")
    efsmi.assert_not_called()


# -- ENFLAME_VISIBLE_DEVICES (Kubernetes device plugin) -------------------------


def test_enflame_visible_devices_counts_and_maps_cards(monkeypatch, no_efsmi):
    monkeypatch.setenv("ENFLAME_VISIBLE_DEVICES", "4,5,6")
    assert cards.count_cards() == (3, "ENFLAME_VISIBLE_DEVICES=4,5,6")
    assert cards.physical_card(1) == "5"
    no_efsmi.assert_not_called()


def test_tops_visible_devices_wins_over_enflame(monkeypatch):
    monkeypatch.setenv("ENFLAME_VISIBLE_DEVICES", "4,5,6,7")
    monkeypatch.setenv("TOPS_VISIBLE_DEVICES", "6,7")
    assert cards.visible_devices() == ["6", "7"]
    assert cards.physical_card(0) == "6"
    assert cards.count_cards() == (
        2,
        "TOPS_VISIBLE_DEVICES=6,7; ENFLAME_VISIBLE_DEVICES=4,5,6,7 is ignored "
        "(TOPS_VISIBLE_DEVICES wins)",
    )


def test_empty_tops_visible_devices_hides_the_plugin_cards(monkeypatch):
    monkeypatch.setenv("ENFLAME_VISIBLE_DEVICES", "4,5")
    monkeypatch.setenv("TOPS_VISIBLE_DEVICES", "")
    assert cards.count_cards()[0] == 0


@pytest.mark.parametrize("visible, simulated, count", [("0,1,2,3", "2", 2), ("0,1", "8", 2)])
def test_simulator_caps_visible_devices(monkeypatch, visible, simulated, count):
    monkeypatch.setenv("TOPS_VISIBLE_DEVICES", visible)
    monkeypatch.setenv("MMGCU_SIMULATE", simulated)
    assert cards.count_cards() == (count, f"TOPS_VISIBLE_DEVICES={visible}")


def test_simulator_alone(monkeypatch, efsmi):
    monkeypatch.setenv("MMGCU_SIMULATE", "4")
    assert cards.count_cards() == (4, "MMGCU_SIMULATE=4 (simulated cards)")
    efsmi.assert_not_called()


# -- efsmi ----------------------------------------------------------------------


def test_parse_classic_counts_only_the_first_line_of_each_card():
    assert cards.parse_efsmi(EFSMI_CLASSIC) == [(0, "T20"), (1, "T20")]


def test_classic_temperature_line_is_not_a_card():
    line = "* 30C    Sleep   48.0W  300W | 32G      Disable|   0.0%     W28001210504  *"
    assert cards.parse_efsmi(line) == []


def test_parse_pipe_table():
    assert cards.parse_efsmi(EFSMI_TABLE) == [(0, "T20"), (1, "T20"), (2, "S60")]


def test_pipe_table_temperature_line_is_not_a_card():
    assert cards.parse_efsmi("| 35C  Sleep  | 32G     | 0.0%      | W2800  |") == []


def test_parse_sorts_by_index_and_keeps_the_first_name():
    text = "\n".join(f"| {i}    T20    | 10.19.3 |" for i in (10, 2, 0))
    text += "\n| 2    S60    | 1.2.0 |"
    assert cards.parse_efsmi(text) == [(0, "T20"), (2, "T20"), (10, "T20")]


def test_parse_nothing():
    assert cards.parse_efsmi("") == []
    assert cards.parse_efsmi("efsmi: no device found") == []


def test_efsmi_missing(no_efsmi):
    assert cards.efsmi_cards() is None
    no_efsmi.assert_called_once_with("efsmi")
    assert cards.count_cards() == (
        0,
        "TOPS_VISIBLE_DEVICES and ENFLAME_VISIBLE_DEVICES are unset, no simulator, and efsmi "
        "is missing or lists no card",
    )


def test_efsmi_runs_with_a_timeout(efsmi):
    assert cards.efsmi_cards(timeout=3) == [(0, "T20"), (1, "T20")]
    efsmi.assert_called_once_with(["/usr/bin/efsmi"], capture_output=True, text=True, timeout=3)


def test_count_from_efsmi(efsmi):
    efsmi.return_value = subprocess.CompletedProcess(["efsmi"], 0, EFSMI_TABLE, "")
    assert cards.count_cards() == (3, "efsmi")


def test_efsmi_failing(efsmi):
    efsmi.return_value = subprocess.CompletedProcess(["efsmi"], 1, EFSMI_CLASSIC, "no driver")
    assert cards.efsmi_cards() is None
    assert cards.count_cards()[0] == 0


@pytest.mark.parametrize(
    "error", [OSError("exec format error"), subprocess.TimeoutExpired("efsmi", 10)]
)
def test_efsmi_not_running_or_timing_out(efsmi, error):
    efsmi.side_effect = error
    assert cards.efsmi_cards() is None
    assert cards.count_cards()[0] == 0


def test_main_prints_the_count(monkeypatch, capsys):
    monkeypatch.setenv("TOPS_VISIBLE_DEVICES", "0,1,2,3,4")
    monkeypatch.setattr(cards.sys, "argv", ["cards.py"])
    cards.main()
    assert capsys.readouterr().out == "5\n"


def test_main_says_why_there_is_no_card(monkeypatch, capsys):
    monkeypatch.setenv("TOPS_VISIBLE_DEVICES", "")
    monkeypatch.setattr(cards.sys, "argv", ["cards.py", "--why"])
    cards.main()
    assert capsys.readouterr().out == "TOPS_VISIBLE_DEVICES is set but empty (no card is visible)\n"


@pytest.mark.parametrize(
    "value, parsed",
    [
        ("8", (None, 8)),
        ("t20", ("t20", 8)),
        ("T20", ("t20", 8)),
        ("t20:4", ("t20", 4)),
        ("s60:2", ("s60", 2)),
        ("s60", ("s60", 8)),
        ("0", (None, 0)),
    ],
)
def test_simulate_names_a_count_or_the_hardware_and_its_cards(value, parsed):
    assert cards.parse_simulate(value) == parsed


@pytest.mark.parametrize("value", ["t21", "t20:", "x:4", "eight", "t20:4:1"])
def test_simulate_of_unknown_hardware_is_refused_with_the_forms(value):
    with pytest.raises(ValueError, match="give a card count .*t20, s60 .*t20:4"):
        cards.parse_simulate(value)


def test_simulated_hardware_counts_as_its_cards(monkeypatch, no_efsmi):
    monkeypatch.delenv("TOPS_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ENFLAME_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("MMGCU_SIMULATE", "t20")
    assert cards.count_cards() == (8, "MMGCU_SIMULATE=t20 (simulated cards)")
    monkeypatch.setenv("TOPS_VISIBLE_DEVICES", "0,1")
    assert cards.count_cards()[0] == 2
