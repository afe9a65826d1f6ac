"""How a failed run ends: a narrow ``sys.excepthook``.

(Also :func:`stop_every_rank`, for a fault every rank sees but one should report.)

``sys.excepthook`` is wrapped for three cases only, and everything else reaches the previous
hook untouched:

- a :class:`~mmgcu.errors.GCUError` (a launch or set-up mistake): its message already
  says what was found, what was expected and the fix, so it is printed alone;
- mmengine's own Runner calling ``torch.cuda.set_device`` in ``init_dist`` on a host whose
  cards are GCUs ("_cuda_setDevice" or "Found no NVIDIA driver"): either the config leaves
  ``runner_type`` out (mmgcu names the key), or it sets it and the script ignores it, as
  mmseg 1.2.2's ``tools/test.py`` does (mmgcu names the script and ``mmgcu test``). Rank 0
  says it; the other ranks say only that they stop;
- model code that gives a card tensor to a ``torch.distributed`` collective of a gloo group
  on torch_gcu 1.x ("ProcessGroupGloo::allreduce: unsupported device type xla"): a group
  made with ``backend='gloo'``, or a default group of gloo (``dist_cfg.backend='gloo'``, or
  made before GCURunner). mmgcu's own default group there, ``gloo_eccl``, sends card tensors
  to ECCL (mmdet's ``reduce_mean`` in Mask2Former's loss runs); mmgcu names the caller
  and the fix.

``MMGCU_TRACEBACK=1`` keeps the full traceback in all three.

The ``mmgcu`` command and ``GCURunner`` install it
(:func:`install`). ``import mmgcu`` installs it only on a GCU host (torch_gcu importable, or
simulated): there a script that builds mmengine's own Runner fails before any mmgcu code
runs but the import, and this hook is what names the fix (:func:`install_on_gcu_host`).
"""

import importlib.util
import os
import re
import sys
import time
import traceback
from typing import Optional

from ..errors import GCUError
from .rank_warnings import launcher_rank

RUNNER_TYPE_MISSING = (
    "the config imports mmgcu but runs mmengine's own Runner, whose init_dist calls "
    "torch.cuda.set_device on a GCU host. Add runner_type = 'GCURunner' to the config "
    "(or inherit configs/_base_/gcu_runtime.py, which sets it)."
)


def gcu_host() -> bool:
    """Whether torch_gcu is importable here (or simulated)."""
    return "torch_gcu" in sys.modules or importlib.util.find_spec("torch_gcu") is not None


def _cuda_in_stock_init_dist(exc, tb) -> bool:
    """Whether this is stock mmengine setting a CUDA device in ``init_dist`` on a GCU host."""
    from ..compat.mmengine import failed_in_stock_init_dist

    cuda_error = "cuda" in str(exc).lower() or "nvidia" in str(exc).lower()
    return gcu_host() and cuda_error and failed_in_stock_init_dist(tb)


def script_ignores_runner_type(runner_type: str) -> str:
    """Why a config that sets ``runner_type`` still ran mmengine's Runner, and the fix."""
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "this script"
    return (
        f"{script} builds mmengine's own Runner whatever runner_type says (this config sets "
        f"runner_type = {runner_type!r}), and that Runner calls torch.cuda.set_device on a "
        "GCU host. Run the same arguments with 'mmgcu test CONFIG CHECKPOINT [CARDS] ...' "
        "(or tools/dist_test.sh), which honours runner_type."
    )


def _config_runner_type(tb) -> Optional[str]:
    """The ``runner_type`` of the config ``Runner.from_cfg`` was given, if any."""
    while tb is not None:
        frame = tb.tb_frame
        cfg = frame.f_locals.get("cfg") if frame.f_code.co_name == "from_cfg" else None
        if cfg is not None and hasattr(cfg, "get") and cfg.get("runner_type"):
            return str(cfg.get("runner_type"))
        tb = tb.tb_next
    return None


#: gloo refusing a torch_gcu 1.x card tensor: the collective and the device type.
_GLOO_REFUSES_CARD = re.compile(r"ProcessGroupGloo::(\w+): unsupported device type (xla)")


def _caller(tb) -> str:
    """``file:line (function)`` of the innermost frame outside torch and mmengine.dist:
    the model code that called the collective."""
    found = "the model's code"
    for frame in traceback.extract_tb(tb):
        path = frame.filename.replace(os.sep, "/")
        if "/torch/" not in path and "/mmengine/dist/" not in path:
            found = f"{frame.filename}:{frame.lineno} ({frame.name})"
    return found


def card_tensor_in_cpu_collective(exc, tb) -> Optional[str]:
    """What to say when model code gave a card tensor to a gloo group on torch_gcu 1.x."""
    found = _GLOO_REFUSES_CARD.search(str(exc))
    if found is None or "torch_gcu" not in sys.modules:
        return None
    return (
        f"{_caller(tb)} calls torch.distributed's {found.group(1)} on a card tensor "
        f"({found.group(2)}) in a group whose backend is gloo, which carries CPU tensors "
        "only. On torch_gcu 1.x mmgcu's default group, gloo_eccl, sends card tensors to "
        "torch_gcu.distributed's ECCL world (a subgroup's through the CPU): leave "
        "env_cfg.dist_cfg.backend unset (or 'eccl'), let GCURunner create the process "
        "groups, and make the model's groups with torch.distributed.new_group() without "
        "backend='gloo'. Or move the tensor to the CPU and back around that call."
    )


def _explain(exc_type, exc, tb):
    """The message mmgcu prints instead of the traceback, or None to leave it alone."""
    if os.environ.get("MMGCU_TRACEBACK"):
        return None
    if issubclass(exc_type, GCUError):
        return f"\nmmgcu: {exc}\n"
    if _cuda_in_stock_init_dist(exc, tb):
        runner_type = _config_runner_type(tb)
        why = script_ignores_runner_type(runner_type) if runner_type else RUNNER_TYPE_MISSING
    else:
        why = card_tensor_in_cpu_collective(exc, tb)
    if why is None:
        return None
    rank = launcher_rank()  # every rank fails the same way: rank 0 says why
    if rank != 0:
        return f"mmgcu: rank {rank} stops: rank 0 says why\n"
    return f"\n{exc_type.__name__}: {exc}\nmmgcu: {why}\n"


def install(previous=None) -> None:
    """Wrap ``sys.excepthook`` (once)."""
    previous = previous or sys.excepthook
    if getattr(previous, "mmgcu", False):
        return

    def hook(exc_type, exc, tb):
        message = _explain(exc_type, exc, tb)
        if message is None:
            previous(exc_type, exc, tb)
        else:
            sys.stderr.write(message)

    hook.mmgcu = True
    sys.excepthook = hook


def install_on_gcu_host() -> None:
    """:func:`install`, on a GCU host only (what ``import mmgcu`` does)."""
    if gcu_host():
        install()


def stop_every_rank(message: str, rank: int, world_size: int, grace_s: float):
    """Stop every rank over a fault all of them see, with one message: rank 0's.

    The other ranks wait (at most ``grace_s``) for the launcher to end them once rank 0
    has failed, so the launcher names rank 0, and the console shows the message once
    instead of once per rank.
    """
    if rank == 0 or world_size == 1:
        raise GCUError(message)
    time.sleep(grace_s)
    raise GCUError(f"rank {rank} stops: rank 0 says why")
