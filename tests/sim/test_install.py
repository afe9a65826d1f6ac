"""Installing the simulator: what it is asked for, what it refuses, and nothing when not asked."""

import importlib.util

import pytest

import mmgcu.sim
from tests.conftest import TORCH_1, last_json, needs_torch2
from tests.sim.helpers import APIS, DEVICE_TYPE, program, run_program, sim_json


def test_the_apis_and_their_aliases():
    assert mmgcu.sim.APIS == APIS
    assert mmgcu.sim.API_ALIASES == {"v2": "gcu2", "legacy": "gcu1"}


@pytest.mark.parametrize(
    "api, given", [pytest.param("gcu2", "v2", marks=needs_torch2), ("gcu1", "gcu1")]
)
def test_visible_devices_limit_the_cards(api, given):
    out = sim_json("visible_cards", api=given, cards=8, TOPS_VISIBLE_DEVICES="0,1,2")
    kind = DEVICE_TYPE[api]
    assert out["api"] == api  # an alias names the same generation
    assert out["same"] is True  # a second install returns the installed module
    assert out["count"] == 3
    if api == "gcu2":
        assert out["set_5"] is not None and "invalid" in out["set_5"]
    else:  # torch_gcu 1.x ignores a card that is not there without a word
        assert out["set_5"] is None
    assert out["current_after_set_5"] == 0
    assert out["current"] == 2
    assert out["default_card"] == f"{kind}:2"  # an index-less device means the current card
    assert out["tensor_on_5"] is not None and "invalid" in out["tensor_on_5"]


def test_explicit_arguments_without_environment():
    out = last_json(run_program(program("explicit_install")).stdout)
    assert out == {"count": 4, "device": "xla:3", "has_torch_gcu_module": False}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MMGCU_SIMULATE": 8, "MMGCU_SIMULATE_API": "bogus"}, "MMGCU_SIMULATE_API='bogus'"),
        ({"MMGCU_SIMULATE": 0, "MMGCU_SIMULATE_API": "gcu2"}, "at least one card"),
        (
            {"MMGCU_SIMULATE": "t20", "MMGCU_SIMULATE_API": "gcu2"},
            "MMGCU_SIMULATE=t20 simulates T20 cards (the gcu1 API) but MMGCU_SIMULATE_API=gcu2",
        ),
        ({"MMGCU_SIMULATE": "t99"}, "MMGCU_SIMULATE='t99': give a card count"),
    ],
)
def test_bad_requests_raise_value_error(env, message):
    out = last_json(run_program(program("refused_install"), **env).stdout)
    assert out["error"] is not None and message in out["error"]
    assert out["installed"] is False


def test_the_refusal_names_every_api():
    out = last_json(
        run_program(program("refused_install"), MMGCU_SIMULATE=8, MMGCU_SIMULATE_API="tpu").stdout
    )
    assert "expected one of gcu2, gcu1, v2, legacy" in out["error"]


def test_nothing_installed_without_request():
    proc = run_program(program("not_asked"))  # no MMGCU_* variable: clean_env drops them
    out = last_json(proc.stdout)
    assert out == {
        "requested": False,
        "installed": False,
        "in_modules": False,
        # torch's name until a backend renames it (torch 1.x has no PrivateUse1 naming)
        "backend_name": None if TORCH_1 else "privateuseone",
        "torch_gcu_attr": False,
        "import": "ModuleNotFoundError",
    }
    assert "SIMULATED" not in proc.stderr


@pytest.mark.skipif(
    importlib.util.find_spec("mmengine") is None, reason="import mmgcu needs mmengine"
)
@pytest.mark.parametrize("cards", ["", "2"])
def test_import_mmgcu_installs_only_when_asked(cards):
    env = {"MMGCU_SIMULATE": cards} if cards else {}  # the generation this torch runs
    out = last_json(run_program(program("import_mmgcu"), **env).stdout)
    assert out == {"cards": int(cards) if cards else None}


@pytest.mark.parametrize(
    "env, count",
    [
        # Kubernetes: the device plugin's cards are the container's only cards.
        ({"ENFLAME_VISIBLE_DEVICES": "4,5,6"}, 3),
        # Set but empty hides every card, as CUDA_VISIBLE_DEVICES="" does.
        ({"ENFLAME_VISIBLE_DEVICES": "4,5,6", "TOPS_VISIBLE_DEVICES": ""}, 0),
    ],
)
def test_visible_device_variables_limit_the_simulated_cards(env, count):
    out = sim_json("card_count", cards=8, **env)
    assert out == count
