"""Files one process writes while others may read them, or a crash may cut the write short:
each is written under a temporary name and renamed, so a reader sees the old file or the
new one, never half (checkpoints, ``last_checkpoint``, heartbeats, per-rank reports)."""

import errno
import json
import os
import os.path as osp
from typing import Callable, Dict


def partial_name(filename: str) -> str:
    """The temporary name a file is written under before it is complete."""
    return f".{filename}.partial"


def fsync_file(path: str) -> None:
    """Flush ``path``'s data to the disk (an fd opened for reading flushes it on Linux)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Make a rename in ``path`` durable. File systems that cannot fsync a folder are let be."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_atomically(path: str, write: Callable[[str], None], durable: bool = True) -> None:
    """``write(partial)`` writes the file's content to the path it is given; it ends up as
    ``path``, complete, or not at all (a failed write removes its partial file). ``durable``
    also puts it on the disk before and after the rename (fsync), as a checkpoint needs and
    a heartbeat, rewritten every few seconds, does not."""
    folder, name = osp.split(path)
    partial = osp.join(folder, partial_name(name))
    try:
        write(partial)
        if durable:
            fsync_file(partial)
    except BaseException:
        if osp.exists(partial):  # e.g. a full disk: give the space back
            os.remove(partial)
        raise
    os.replace(partial, path)
    if durable:
        fsync_dir(folder)


def write_text_atomically(path: str, text: str, durable: bool = True) -> None:
    """Replace ``path`` by a file holding ``text`` (see :func:`write_atomically`)."""

    def write(partial: str) -> None:
        with open(partial, "w") as f:
            f.write(text)

    write_atomically(path, write, durable)


def write_json_atomically(path: str, data, durable: bool = True) -> None:
    """Replace ``path`` by ``data`` as JSON (see :func:`write_atomically`)."""
    write_text_atomically(path, json.dumps(data, indent=1), durable)


def rank_file(folder: str, rank: int) -> str:
    """The JSON file of ``rank`` in a folder of per-rank files."""
    return osp.join(folder, f"rank{rank}.json")


def read_rank_files(folder: str) -> Dict[int, dict]:
    """The JSON file of every rank in ``folder`` that wrote a readable one, by rank."""
    found = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return found
    for name in names:
        if not (name.startswith("rank") and name.endswith(".json")):
            continue
        try:
            with open(osp.join(folder, name)) as f:
                data = json.load(f)
            found[int(data["rank"])] = data
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found
