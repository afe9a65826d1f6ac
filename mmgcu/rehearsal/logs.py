"""A job's log: the first error in it, and the fix mmgcu knows for that error.

A rank that fails before the rehearsal's hooks run (a config or registry error, a model
that cannot be built) leaves only the log, whose first exception is the one reported.
"""

import re
from typing import List, Optional, Tuple

#: mmcv's dispatcher refusing a compiled op on a device it has no kernel for.
_NO_KERNEL = re.compile(
    r"(\w+?)(?:_forward|_backward)?_impl: implementation for device (\S+) not found"
)
#: Known failures and what fixes them: (pattern, fix; ``{0}``.. are the pattern's groups).
FIXES: Tuple[Tuple[re.Pattern, str], ...] = (
    (
        _NO_KERNEL,
        "mmcv's compiled op '{0}' has no kernel on a GCU card ({1}), and mmgcu has no "
        "counterpart for it (mmgcu runs PSAMask on the card). Build the model without the "
        "layer that calls it (for a DCN backbone: leave out its dcn dict), or give the op a "
        "card path and register it in mmgcu/model/mmcv_ops.py.",
    ),
    (
        re.compile(r"ProcessGroupGloo::(\w+): unsupported device type (xla)"),
        "the model gives a card tensor to torch.distributed's {0} on a gloo group, which "
        "carries CPU tensors only. On torch_gcu 1.x mmgcu's default group (gloo_eccl) sends "
        "card tensors to ECCL: leave env_cfg.dist_cfg.backend unset (or 'eccl') and make the "
        "model's groups without backend='gloo', or move that tensor to the CPU and back "
        "around the call.",
    ),
    (
        re.compile(r"'?(\S+?)'? is not in the (\S+) registry"),
        "'{0}' is not registered: add the module that defines it to custom_imports in the "
        "config (custom_imports given with --cfg-options is not imported).",
    ),
    (
        re.compile(r"killed by SIGKILL.*out-of-memory"),
        "the simulated cards of all ranks share this host's memory: rehearse on fewer "
        "--cards, or at --scale small, or on a host with more memory. The per-card peak of "
        "a run that fits says what each card needs.",
    ),
    (
        re.compile(r"(aten::batch_norm_stats|batch_norm_gather_stats|batch_norm_elemt)"),
        "torch's SyncBatchNorm has no GCU kernel ({0}); run with runner_type='GCURunner', "
        "which puts GCUSyncBatchNorm in place of SyncBN layers.",
    ),
)


#: A model library that the environment the jobs ran in lacks (mmpretrain imports
#: torchvision; mmdet needs no torchvision).
_NO_MODULE = re.compile(r"No module named '(mmpretrain|mmdet|torchvision)")


def _install_fix(module: str, torch: Optional[str]) -> str:
    """What installs ``module`` in the environment the jobs ran in, whose torch is
    ``torch`` (None: unknown): the T20 stack's torch 1.x, or torch 2.x.

    ``tools/install_t20.sh`` installs mmpretrain, and torchvision where that environment
    has none; mmdet only with ``--mmdet``. mmdet runs on torch 2.x too, but no torchvision
    build matches torch 2.13, so mmpretrain's models are rehearsed on the T20 stack.
    """
    t20 = torch is None or torch.startswith("1.")
    if module == "mmdet":
        how = (
            "tools/install_t20.sh PYTHON --mmdet" if t20 else "pip install -r requirements/zoo.txt"
        )
        return (
            "this environment lacks mmdet, which mmseg's Mask2Former and MaskFormer heads "
            f"need: install mmdet 3.3.0 ({how}; docs/t20.md)."
        )
    if t20:
        return (
            f"this environment lacks {module}: tools/install_t20.sh PYTHON installs "
            "mmpretrain 1.2.0 and, where the environment has no torchvision, the torchvision "
            "release built for its torch (torch 1.10.2: 0.11.3; docs/t20.md)."
        )
    if torch.startswith("2.13"):
        return (
            f"this environment lacks {module} (mmpretrain imports torchvision), and no "
            "torchvision build matches torch 2.13: rehearse models of mmpretrain on the T20 "
            "stack (make install-t20, then its python; docs/t20.md)."
        )
    return (
        f"this environment lacks {module}: install the torchvision release built for torch "
        f"{torch}, then mmpretrain 1.2.0 (requirements/t20-models.txt), which imports it."
    )


def fix_for(message: str, card_ops: List[dict] = (), torch: Optional[str] = None) -> Optional[str]:
    """The fix mmgcu knows for an error message, or None; ``card_ops`` (the model's mmcv
    layers, as the hook lists them) names the layers of an op with no card kernel, and
    ``torch`` (the version the jobs ran, None: unknown) says how a missing model library
    is installed there."""
    missing = _NO_MODULE.search(message)
    if missing:
        return _install_fix(missing.group(1), torch)
    for pattern, fix in FIXES:
        found = pattern.search(message)
        if found:
            text = fix.format(*found.groups())
            if pattern is _NO_KERNEL:
                layers = [f"{o['op']} x{o['count']}" for o in card_ops if "no card" in o["path"]]
                text += (
                    f" The model's layers with no card kernel: {', '.join(layers)}."
                    if layers
                    else ""
                )
            return text
    return None


#: torchrun's prefix on a worker's lines (torch 2's ``[rank1]: ``).
_RANK_PREFIX = re.compile(r"^\[(?:default)?(?:rank)?\d+\]:\s?")
# An exception's own line: its name alone, or with ': ' and the message. Not a name that
# another rank's unmarked output cut short (torch 1.10, unbuffered ranks writing the same
# log: "IndexError  File ...", then ": index 255 ..." on the next line).
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)(:\s|:$|$)")


def _by_rank(log: str) -> List[Tuple[str, str]]:
    """``(rank prefix or '', line)`` for each line of a job's log."""
    out = []
    for raw in log.splitlines():
        found = _RANK_PREFIX.match(raw)
        out.append((found.group(0).strip(), raw[found.end() :]) if found else ("", raw))
    return out


def first_error(log: str) -> Optional[str]:
    """The first exception in a job's log (the last line of its first traceback, read
    among the lines of the same rank where torchrun marks them), or the message mmgcu's
    excepthook printed in its place (``mmgcu: ...`` after a blank line, alone or under the
    exception's own line); None when the log has neither."""
    lines = _by_rank(log)
    for i, (who, line) in enumerate(lines):
        if line.startswith("mmgcu: ") and "stops: rank 0 says why" not in line:
            # a blank line carries no rank prefix: it belongs to any rank
            before = [t for r, t in lines[max(0, i - 2) : i] if r == who or not t.strip()]
            if before and not before[-1].strip():
                return line
            if len(before) == 2 and not before[0].strip() and _EXCEPTION.match(before[1]):
                return f"{before[1]}\n{line}"
        if line.startswith("Traceback (most recent call last)"):
            # the first exception line after it: torch 1.10's torchrun does not mark its
            # ranks' lines, so another rank's traceback or log may come in between
            found = next(
                (t for r, t in lines[i + 1 :] if r == who and _EXCEPTION.match(t)),
                "",
            )
            if found and "ChildFailedError" not in found:  # not torchrun's own summary
                return found.strip()
    for _, line in lines:  # no traceback: a rank killed (torchrun's summary says how)
        if re.search(r"exitcode\s*:\s*-9\b", line):
            return (
                "a rank was killed by SIGKILL with no traceback (exitcode -9): most likely "
                "the kernel's out-of-memory killer, since simulated cards are host memory"
            )
    for _, line in lines:
        if "ChildFailedError" in line or "exitcode" in line:
            return line.strip()
    return None


def in_wrap_model(log: str) -> bool:
    """Whether a rank that left no record failed in the runner's ``wrap_model`` (the model
    built, then put on its card and wrapped in DDP), rather than building the model."""
    return re.search(r", in wrap_model\b", log) is not None
