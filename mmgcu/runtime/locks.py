"""Locks that keep a second job off the cards and the work dir a running job uses.

Two jobs started on one node would each put a rank on every card (each card then carries
a rank of each job); two jobs given one ``--work-dir`` interleave their logs and overwrite
each other's checkpoints. So each rank holds an exclusive ``flock`` on a file per card it
uses, and rank 0 one on ``WORK_DIR/.mmgcu/lock``, from the set-up on (before the runner
writes its log or config dump into the work dir). A ``flock`` belongs
to the open file and ends with the process: a crashed or killed job leaves no stale lock.
Each file says who holds it (pid, launcher pid, host, work dir, rendezvous), for the
message of the job that is refused.

Card locks live in one folder per node: ``$MMGCU_LOCK_DIR``, else ``/dev/shm/mmgcu-locks``
(in memory, on every Linux host; made sticky and writable for every user, like /tmp),
else ``<tempdir>/mmgcu-locks``.
"""

import errno
import fcntl
import json
import os
import os.path as osp
import re
import socket
import tempfile
import time
from typing import List, Optional, Tuple

from mmengine.dist import all_gather_object

from ..device import Accelerator, physical_card
from ..errors import GCUError

LOCK_DIR_ENV = "MMGCU_LOCK_DIR"


def lock_dir() -> str:
    """The node-wide folder of the card locks (created, writable by every user)."""
    given = os.environ.get(LOCK_DIR_ENV)
    candidates = [given] if given else ["/dev/shm/mmgcu-locks"]
    candidates.append(osp.join(tempfile.gettempdir(), "mmgcu-locks"))
    for folder in candidates:
        try:
            if not osp.isdir(folder):
                os.makedirs(folder, exist_ok=True)
                os.chmod(folder, 0o1777)  # every user's jobs lock here; none removes another's
            if os.access(folder, os.W_OK | os.X_OK):
                return folder
        except OSError:
            continue
    raise GCUError(f"no folder for the card locks is writable: tried {', '.join(candidates)}")


def job_id() -> str:
    """What every rank of one job shares and no two running jobs do: the rendezvous
    address (two running jobs cannot listen on one port of one host)."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        return f"{addr}:{port}"
    return f"{socket.gethostname()}:pid{os.getpid()}"


class HeldLocks:
    """The lock files this process holds; closing them (or exiting) releases them."""

    def __init__(self, fds: List[int]):
        self.fds = fds

    def release(self) -> None:
        while self.fds:
            os.close(self.fds.pop())

    def __del__(self):
        self.release()


def try_lock(path: str, me: dict, shared=False) -> Tuple[Optional[int], Optional[dict]]:
    """``(fd, None)`` when this process now holds ``path``, ``(None, holder)`` when not.

    ``shared``: the file is made writable by every user (a card lock in the node's folder).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's file: locking needs no write access
        fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        return None, read_holder(path)
    try:
        if shared and os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o666)
        data = json.dumps(me).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    except OSError:
        pass  # held all the same; only the holder's details are missing
    return fd, None


def read_holder(path: str) -> dict:
    """Who holds ``path``. A holder that has just locked it may not have written yet: the
    file is then empty or still names its previous holder, whose process has ended."""
    holder = {}
    for _ in range(20):
        try:
            with open(path) as f:
                holder = json.load(f)
            if holder.get("host", socket.gethostname()) != socket.gethostname():
                return holder  # another host's process: not ours to look up
            if _alive(holder.get("pid")):
                return holder
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return holder


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except PermissionError:
        return True  # another user's process
    except (OSError, TypeError, ValueError):
        return False
    return True


def _me(rank: int, work_dir: str, what: str) -> dict:
    return dict(
        pid=os.getpid(),
        launcher_pid=os.getppid(),
        host=socket.gethostname(),
        rank=rank,
        work_dir=work_dir,
        job=job_id(),
        started=time.strftime("%Y-%m-%d %H:%M:%S"),
        holds=what,
    )


def _agree(distributed: bool, conflicts: list, locks: List[int]) -> HeldLocks:
    """Every rank learns every rank's conflicts; all stop on the first one."""
    held = HeldLocks(locks)
    everyone = all_gather_object(conflicts) if distributed else [conflicts]
    found = [c for mine in everyone for c in mine]
    if found:
        held.release()
        raise GCUError(refusal(*found[0]))
    return held


def hold(accelerator: Accelerator, rank: int, work_dir: str, distributed: bool) -> HeldLocks:
    """Lock this rank's card (GCU cards only: the accelerator's current card) and, on rank
    0, the work dir; stop every rank, before anything is written, if another job holds one
    of them. ``distributed``: the process groups exist, and every rank calls this."""
    conflicts, fds = [], []
    if accelerator.is_gcu:
        card = physical_card(accelerator.current_device())
        path = osp.join(lock_dir(), f"gcu{re.sub(r'[^A-Za-z0-9_.-]', '_', card)}.lock")
        fd, holder = try_lock(path, _me(rank, work_dir, f"card {card}"), shared=True)
        # Two ranks of one job on one card: the placement check names them better.
        if holder is not None and holder.get("job") != job_id():
            conflicts.append((f"card {card} of {socket.gethostname()}", holder))
        fds += [fd] if fd is not None else []
    if rank == 0:
        folder = osp.join(work_dir, ".mmgcu")
        os.makedirs(folder, exist_ok=True)
        fd, holder = try_lock(osp.join(folder, "lock"), _me(rank, work_dir, "work dir"))
        if holder is not None and holder.get("job") != job_id():
            conflicts.append((f"the work dir {work_dir}", holder))
        fds += [fd] if fd is not None else []
    return _agree(distributed, conflicts, fds)


def refusal(what: str, holder: dict) -> str:
    """The message of a job refused because another holds ``what``."""
    who = (
        f"pid {holder.get('pid', '?')} (rank {holder.get('rank', '?')}, launcher pid "
        f"{holder.get('launcher_pid', '?')}) on {holder.get('host', '?')}, started "
        f"{holder.get('started', '?')}, work dir {holder.get('work_dir', '?')}"
    )
    if what.startswith("card"):
        why = (
            "Two jobs on one card each get part of it and slow or starve each other. Wait for "
            "that job to end, or give this one other cards (TOPS_VISIBLE_DEVICES=... and as "
            "many ranks)."
        )
    else:
        why = (
            "Two jobs in one work dir interleave their logs and overwrite each other's "
            "checkpoints. Give this job its own --work-dir, or wait for that job to end."
        )
    return f"{what} is in use by another running job: {who}. {why}"
