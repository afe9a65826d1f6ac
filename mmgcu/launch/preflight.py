"""What ``mmgcu train``, ``test`` and ``rehearse`` check in the config before any process starts.

A stock mmseg config (``mmseg::_base_/default_runtime.py``, no ``custom_imports``) runs
mmengine's own Runner, whose ``init_dist`` calls ``torch.cuda.set_device`` on a GCU host:
every rank then prints a traceback ending ``module 'torch._C' has no attribute
'_cuda_setDevice'``. The launcher reads the config once (mmengine's ``Config``, without
importing the config's custom modules, so no torch) and names the two keys instead.

Standard library at import, as the rest of :mod:`mmgcu.launch`; mmengine is imported only
inside :func:`config_problem`, after the launcher has checked it is importable.
"""

from typing import List, Optional

from .configs import BASE

KEYS = (
    "custom_imports = dict(imports=['mmgcu'], allow_failed_imports=False) and "
    "runner_type = 'GCURunner'"
)


def cfg_options(args: List[str]) -> dict:
    """The ``key=value`` pairs given after ``--cfg-options`` (values as text)."""
    options, taking = {}, False
    for arg in args:
        if arg == "--cfg-options":
            taking = True
        elif arg.startswith("--"):
            taking = False
        elif taking and "=" in arg:
            key, value = arg.split("=", 1)
            options[key] = value.strip("'\"")
    return options


def imports_of(custom_imports) -> List[str]:
    """The module names a config's ``custom_imports`` lists."""
    if not custom_imports:
        return []
    imports = custom_imports.get("imports", []) if hasattr(custom_imports, "get") else []
    return [imports] if isinstance(imports, str) else [str(m) for m in imports]


def problem_of(config: str, runner_type, imports: List[str]) -> Optional[str]:
    """What keeps ``config`` off the cards, given its ``runner_type`` and imports (a module
    of the user's may import mmgcu itself, so any import counts)."""
    if not runner_type:
        missing = "runner_type" + (" and no custom_imports" if not imports else "")
        return (
            f"{config} would run on mmengine's own Runner, which calls torch.cuda.set_device "
            f"on a GCU host: it sets no {missing}"
        )
    if not imports:
        return (
            f"{config} sets runner_type = {runner_type!r} but imports nothing, so that runner "
            "is not registered: it has no custom_imports"
        )
    return None


def config_problem(config: str, script_args: List[str]) -> Optional[str]:
    """Why ``config`` cannot run on GCU cards under the stock scripts, as one sentence
    that names the fix; None when it can."""
    from mmengine.config import Config

    try:
        cfg = Config.fromfile(config, import_custom_modules=False)
    except Exception as e:  # the workers would fail on it the same way
        return f"cannot read the config {config}: {type(e).__name__}: {e}"
    given = cfg_options(script_args)
    runner_type = given.get("runner_type", cfg.get("runner_type"))
    problem = problem_of(config, runner_type, imports_of(cfg.get("custom_imports")))
    if problem is None:
        return None
    return (
        f"{problem}. Add {KEYS} to the config, or put mmgcu's base config in "
        f"_base_ in place of mmseg's default_runtime.py ('mmgcu configs {BASE}' prints its "
        "path)."
    )
