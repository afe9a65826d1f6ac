"""Installing the simulator: what it is asked for, what it refuses, and nothing when not asked."""

import importlib.util

import pytest

from tests.conftest import last_json, run_python
from tests.sim.helpers import sim_code, sim_json

VISIBLE = """
import json

import mmgcu.sim
from mmgcu.sim import install

first = install()
import torch
import torch_gcu

api = mmgcu.sim.state.api
dev = torch.gcu if api == "v2" else torch_gcu
out = {"same": install() is first is torch_gcu, "count": dev.device_count()}
try:
    dev.set_device(5)
    out["set_5"] = None
except RuntimeError as e:
    out["set_5"] = str(e)
dev.set_device(2)
out["current"] = dev.current_device()
kind = "gcu" if api == "v2" else "xla"
out["default_card"] = str(torch.empty(1, device=kind).device)
if api == "legacy":
    try:
        torch_gcu.gcu_device(5)
        out["gcu_device_5"] = None
    except RuntimeError as e:
        out["gcu_device_5"] = str(e)
print(json.dumps(out))
"""


@pytest.mark.parametrize("api", ("v2", "legacy"))
def test_visible_devices_limit_the_cards(api):
    out = sim_json(VISIBLE, api=api, cards=8, TOPS_VISIBLE_DEVICES="0,1,2")
    kind = "gcu" if api == "v2" else "xla"
    assert out["same"] is True  # a second install returns the installed module
    assert out["count"] == 3
    assert out["set_5"] is not None and "invalid" in out["set_5"]
    assert out["current"] == 2
    assert out["default_card"] == f"{kind}:2"  # an index-less device means the current card
    if api == "legacy":
        assert out["gcu_device_5"] is not None and "invalid" in out["gcu_device_5"]


def test_explicit_arguments_without_environment():
    out = last_json(
        run_python(
            sim_code(
                """
                import json

                from mmgcu.sim import install

                torch_gcu = install(cards=4, api="legacy")
                import torch

                print(json.dumps({
                    "count": torch_gcu.device_count(),
                    "device": str(torch_gcu.gcu_device(3)),
                    "has_torch_gcu_module": hasattr(torch, "gcu"),
                }))
                """
            )
        ).stdout
    )
    assert out == {"count": 4, "device": "xla:3", "has_torch_gcu_module": False}


REFUSED = """
import json
import sys

import mmgcu.sim
from mmgcu.sim import install

try:
    install()
    out = {"error": None}
except ValueError as e:
    out = {"error": str(e)}
out["installed"] = mmgcu.sim.is_installed() or "torch_gcu" in sys.modules
print(json.dumps(out))
"""


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MMGCU_SIMULATE": 8, "MMGCU_SIMULATE_API": "bogus"}, "MMGCU_SIMULATE_API='bogus'"),
        ({"MMGCU_SIMULATE": 0, "MMGCU_SIMULATE_API": "v2"}, "at least one card"),
    ],
)
def test_bad_requests_raise_value_error(env, message):
    out = last_json(run_python(sim_code(REFUSED), **env).stdout)
    assert out["error"] is not None and message in out["error"]
    assert out["installed"] is False


NOT_ASKED = """
import json
import sys

import mmgcu.sim
import torch

out = {
    "requested": mmgcu.sim.requested(),
    "installed": mmgcu.sim.is_installed(),
    "in_modules": "torch_gcu" in sys.modules,
    "backend_name": torch._C._get_privateuse1_backend_name(),
    "torch_gcu_attr": hasattr(torch, "gcu"),
}
try:
    import torch_gcu  # noqa: F401

    out["import"] = None
except ImportError as e:
    out["import"] = type(e).__name__
print(json.dumps(out))
"""


def test_nothing_installed_without_request():
    proc = run_python(sim_code(NOT_ASKED))  # no MMGCU_* variable: clean_env drops them
    out = last_json(proc.stdout)
    assert out == {
        "requested": False,
        "installed": False,
        "in_modules": False,
        "backend_name": "privateuseone",  # torch's name until a backend renames it
        "torch_gcu_attr": False,
        "import": "ModuleNotFoundError",
    }
    assert "SIMULATED" not in proc.stderr


@pytest.mark.skipif(
    importlib.util.find_spec("mmengine") is None, reason="import mmgcu needs mmengine"
)
@pytest.mark.parametrize("cards", ["", "2"])
def test_import_mmgcu_installs_only_when_asked(cards):
    code = """
        import json

        import mmgcu  # noqa: F401

        try:
            import torch_gcu

            out = {"cards": torch_gcu.gcu.device_count()}
        except ImportError:
            out = {"cards": None}
        print(json.dumps(out))
        """
    env = {"MMGCU_SIMULATE": cards, "MMGCU_SIMULATE_API": "v2"} if cards else {}
    out = last_json(run_python(code, **env).stdout)
    assert out == {"cards": int(cards) if cards else None}


COUNT = """
import json

import mmgcu  # installs the simulated torch_gcu from MMGCU_SIMULATE
from mmgcu.device import select_accelerator

print(json.dumps(select_accelerator().device_count()))
"""


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
    out = last_json(run_python(COUNT, MMGCU_SIMULATE=8, **env).stdout)
    assert out == count
