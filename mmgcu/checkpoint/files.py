"""Checkpoint files that cannot all be lost, and the choice of the one to resume from.

Writing (rank 0): a checkpoint goes to ``.NAME.partial``, is fsynced, renamed to ``NAME``,
and its folder is fsynced, so a crash or a power cut leaves either the whole file or none
under its name. ``last_checkpoint`` is replaced the same way, never rewritten in place.
A ``.partial`` left by a killed save is removed when the next run starts.

Resuming (``--resume``): :func:`resume_target` reads ``last_checkpoint``; when it is
missing, empty or names a file that is gone, the newest complete ``iter_N.pth`` /
``epoch_N.pth`` in the work dir is taken, and the log says so. A run with ``--resume``
never starts from iteration 0 where a checkpoint exists. A damaged checkpoint (0 bytes,
cut short) stops the run with one message naming it and the newest good one.
"""

import glob
import os
import os.path as osp
import re
import zipfile
from typing import List, Optional, Tuple

from ..errors import GCUError
from ..runtime.files import write_atomically

LAST = "last_checkpoint"
_NUMBERED = re.compile(r"^(iter|epoch)_(\d+)\.pth$")
# torch.save before the zip format (torch < 1.6, or _use_new_zipfile_serialization=False)
# starts with a pickled magic number: protocol 2, then a long.
_LEGACY_MAGIC = b"\x80\x02\x8a\x0a"


def save_atomically(write, out_dir: str, filename: str) -> None:
    """``write(name)`` writes a file ``name`` in ``out_dir`` (mmengine's save takes a folder
    and a name); it ends up as ``filename``, complete and on the disk, or not at all."""
    write_atomically(osp.join(out_dir, filename), lambda partial: write(osp.basename(partial)))


def remove_partials(folder: str) -> List[str]:
    """Remove the partial files that killed saves left in ``folder``; return their names."""
    removed = []
    for path in glob.glob(osp.join(folder, ".*.partial")):
        try:
            os.remove(path)
            removed.append(osp.basename(path))
        except OSError:
            pass
    return sorted(removed)


def damage(path: str) -> Optional[str]:
    """Why ``path`` is not a complete checkpoint, or None when it looks whole.

    Reads the zip directory only (torch.save's format since torch 1.6), not the tensors.
    """
    try:
        size = os.path.getsize(path)
        if size == 0:
            return "it is empty (0 bytes)"
        if zipfile.is_zipfile(path):
            return None
        with open(path, "rb") as f:
            if f.read(len(_LEGACY_MAGIC)) == _LEGACY_MAGIC:
                return None
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"
    return f"it is cut short or not a torch checkpoint ({size} bytes, no complete zip directory)"


def numbered_checkpoints(folder: str) -> List[str]:
    """``iter_N.pth`` / ``epoch_N.pth`` in ``folder``, newest (highest N) first."""
    found = []
    for path in glob.glob(osp.join(folder, "*.pth")):
        m = _NUMBERED.match(osp.basename(path))
        if m:
            found.append((int(m.group(2)), osp.getmtime(path), path))
    return [path for _, _, path in sorted(found, reverse=True)]


def newest_complete(folders, exclude=()) -> Optional[str]:
    """The newest whole numbered checkpoint in ``folders`` (``exclude`` left out)."""
    candidates = []
    for folder in dict.fromkeys(folders):  # each once, in order
        candidates += [p for p in numbered_checkpoints(folder) if p not in exclude]
    complete = [p for p in candidates if damage(p) is None]
    return max(complete, key=_step_and_time) if complete else None


def _step_and_time(path: str) -> Tuple[int, float]:
    return int(_NUMBERED.match(osp.basename(path)).group(2)), osp.getmtime(path)


def damaged_message(path: str, why: str, folders) -> str:
    """The one message for a checkpoint that cannot be resumed from."""
    good = newest_complete(list(folders) + [osp.dirname(path)], exclude=(path,))
    head = f"the checkpoint {path} is damaged: {why}."
    if good is None:
        return (
            f"{head} No complete checkpoint is left beside it. Start without --resume "
            "(training restarts at iteration 0 and overwrites the checkpoints there), or "
            "use another --work-dir."
        )
    return (
        f"{head} The newest complete checkpoint is {good}: delete {osp.basename(path)} and "
        f"run with --resume again (mmgcu then resumes from {osp.basename(good)}), or resume "
        f"from it directly with --resume --cfg-options load_from={good}"
    )


def read_last(work_dir: str) -> Tuple[Optional[str], str]:
    """The file ``last_checkpoint`` names (None when unusable), and why it is unusable."""
    last = osp.join(work_dir, LAST)
    if not osp.exists(last):
        return None, f"{last} does not exist"
    with open(last) as f:
        named = f.read().strip()
    if not named:
        return None, f"{last} is empty"
    if "://" not in named and not osp.exists(named):
        return None, f"{last} names {named}, which does not exist"
    return named, ""


def resume_target(work_dir: str) -> Tuple[Optional[str], Optional[str]]:
    """The checkpoint ``--resume`` continues from, and what to log about the choice.

    ``last_checkpoint``'s file when it exists (:func:`load_problem` then checks it), else
    the newest complete one in ``work_dir``. ``(None, note)`` only when ``work_dir`` holds
    no checkpoint; :class:`GCUError` when it holds only damaged ones.
    """
    named, why = read_last(work_dir)
    if named is not None:
        return named, None
    good = newest_complete([work_dir])
    if good is not None:
        return good, f"{why}; resuming from the newest complete checkpoint, {good}"
    left = numbered_checkpoints(work_dir)
    if left:
        raise GCUError(damaged_message(left[0], damage(left[0]) or "unreadable", [work_dir]))
    return None, f"{why} and {work_dir} holds no checkpoint: training starts at iteration 0"


def load_problem(path: str, work_dir: str) -> Optional[str]:
    """The message for a checkpoint file that cannot be loaded, or None."""
    if "://" in str(path) or not osp.isfile(path):
        return None  # remote, or a missing file: mmengine's own error names it
    why = damage(path)
    return None if why is None else damaged_message(path, why, [work_dir])


def batch_change_message(then: dict, now: dict, lr) -> Optional[str]:
    """What a resume on another number of cards changes, or None when nothing does.

    ``then``/``now``: ``ranks`` and ``per_rank`` (the train dataloader's batch size);
    ``lr``: the learning rates the resumed optimizer holds.
    """
    before, after = then["ranks"] * then["per_rank"], now["ranks"] * now["per_rank"]
    if before == after:
        return None
    same = f"launch {then['ranks']} rank(s)"
    if before % now["ranks"] == 0:
        same += f" or set train_dataloader.batch_size={before // now['ranks']}"
    return (
        f"the checkpoint was trained with a global batch of {before} ({then['ranks']} rank(s) x "
        f"{then['per_rank']}); this run trains with {after} ({now['ranks']} rank(s) x "
        f"{now['per_rank']}). The learning rate comes back from the checkpoint unchanged "
        f"(lr={_rates(lr, 1)}, chosen for a batch of {before}); the linear scaling rule "
        f"would give lr={_rates(lr, after / before)}. To continue the same training, {same}. "
        f"mmengine's auto_scale_lr=dict(enable=True, base_batch_size={before}) scales the lr "
        "of a fresh start to its global batch; a resumed optimizer restores its saved lr."
    )


def _rates(lr, factor: float) -> str:
    return ", ".join(f"{v * factor:g}" for v in lr) if lr else "?"
