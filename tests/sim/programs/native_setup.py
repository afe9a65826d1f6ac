"""The set-up of every ``native_*.py`` program: the simulator's extension loaded straight
from ``mmgcu/sim/build.py`` (not through ``mmgcu.sim.install``) and its cards installed.

``python native_X.py KIND CARDS``: KIND is ``xla`` (torch_gcu 1.x) or ``gcu`` (2.x, torch >= 2).
"""

import importlib.util
import json
import os
import os.path as osp
import sys
import types

import torch

HERE = osp.dirname(osp.abspath(__file__))
BUILD_PY = osp.join(HERE, "..", "..", "..", "mmgcu", "sim", "build.py")


def install():
    """``(ext, KIND, D0, D1)`` for the program's command line."""
    kind, cards = sys.argv[1], int(sys.argv[2])
    spec = importlib.util.spec_from_file_location("mmgcu_sim_build", BUILD_PY)
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    ext = build.load_extension()
    ext.install(cards)
    if kind == "gcu":  # as torch_gcu 2.x does: rename PrivateUse1, register torch.gcu
        torch.utils.rename_privateuse1_backend("gcu")
        torch._register_device_module("gcu", types.ModuleType("torch.gcu"))
    return ext, kind, torch.device(kind, 0), torch.device(kind, 1)


def finish(out) -> None:
    """Print ``out`` as JSON and end without interpreter teardown.

    After a backward on a card, PyTorch's autograd thread for that device may still be
    releasing its last graph task, which needs the GIL; a Python 3.11 interpreter
    finalizing meanwhile ends that thread inside a noexcept destructor ("terminate called
    without an active exception", about 1 run in 20 here). An exception raised before this
    still fails the program.
    """
    print(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)
