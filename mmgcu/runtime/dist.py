"""Process-group set-up on GCU cards, for the ``pytorch``, ``slurm`` and ``mpi`` launchers.

Stock ``mmengine.dist.init_dist`` calls ``torch.cuda.set_device`` ("Found no NVIDIA
driver on your system" on a GCU host). Here each rank's card is chosen and checked first,
then the accelerator creates its process groups.
"""

import datetime
import os
from typing import Optional

import torch.distributed as torch_dist

from ..compat.mmengine import set_mpi_env, set_slurm_env
from ..device import Accelerator
from ..device.cards import describe_visible
from ..errors import GCUError

LAUNCHERS = ("pytorch", "slurm", "mpi")

#: Seconds a collective waits when ``env_cfg.dist_cfg.timeout`` is not given: torch's gloo
#: default and torch_gcu 1.x's ECCL default, passed explicitly so that both groups agree.
#: It covers what runs inside collectives and is slow by nature (torch_gcu 1.x compiling
#: the first step's graph, rank 0 computing validation metrics). A hang in steady training
#: ends sooner, through the watchdog (``mmgcu.engine.hooks.watchdog``, 300 s); checkpoint
#: saves never count against it (the other ranks wait for rank 0's save outside any collective).
DEFAULT_TIMEOUT_S = 1800.0


# How a collective reports a peer process that has gone, or that has not answered within
# the timeout (gloo's TCP transport; the simulated ECCL runs over it). torch >= 2.1 device
# backends raise ``DistError``.
_PEER_GONE = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Timed out waiting",
)


def lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective failing because another rank has stopped (or hangs).

    The error worth reading is then the other rank's.
    """
    dist_error = getattr(torch_dist, "DistError", None)  # not in torch 1.10
    if dist_error is not None and isinstance(exc, dist_error):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in _PEER_GONE)


def local_rank(launcher: str) -> int:
    """This process's rank on its node, from the launcher's environment."""
    names = {
        "pytorch": ("LOCAL_RANK",),
        "slurm": ("SLURM_LOCALID", "LOCAL_RANK"),
        "mpi": ("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"),
    }[launcher]
    for name in names:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise GCUError(f"{name}={value!r} is not an integer") from None
    raise GCUError(
        f"{' / '.join(names)} is not set, so this rank cannot choose its card. "
        f"Start training with a launcher ('torchrun --nproc_per_node=N ... --launcher "
        f"{launcher}' or tools/dist_train.sh), which sets it for every rank."
    )


def local_world_size(launcher: str) -> Optional[int]:
    """How many ranks the launcher started on this node, where it says."""
    names = {
        "pytorch": ("LOCAL_WORLD_SIZE",),
        "slurm": ("SLURM_NTASKS_PER_NODE",),
        "mpi": ("OMPI_COMM_WORLD_LOCAL_SIZE",),
    }[launcher]
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def pg_backend_for(requested: Optional[str], accelerator: Accelerator) -> str:
    """The default group's backend for a ``dist_cfg.backend`` on this accelerator.

    ``nccl`` (mmseg's default_runtime) and ``eccl`` mean "the device's backend": on
    torch_gcu 1.x mmgcu's ``gloo_eccl`` (gloo for CPU tensors, the ECCL world for card
    tensors). ``gloo`` cannot carry card tensors: on torch_gcu 2.x, where the default group
    carries them, it is refused; on 1.x, where the card group is ECCL's own, it is taken as
    asked (model code's own torch.distributed calls on card tensors then fail, named).
    """
    if requested in (None, "", "auto", "nccl", "eccl"):
        if requested == "eccl" and not accelerator.is_gcu:
            raise GCUError(
                f"env_cfg.dist_cfg.backend='eccl' but no GCU was found ({accelerator.description})"
            )
        return accelerator.default_pg_backend
    allowed = (accelerator.default_pg_backend,) + tuple(accelerator.other_pg_backends)
    if accelerator.is_gcu and requested not in allowed:
        raise GCUError(
            f"env_cfg.dist_cfg.backend={requested!r} cannot carry GCU tensors: gradients "
            "would not be synchronised on the cards. Remove dist_cfg.backend (mmgcu picks "
            f"'{accelerator.default_pg_backend}') or set it to 'eccl'."
        )
    return requested


def select_card(accelerator: Accelerator, launcher: str) -> int:
    """Check this rank's card against the node's cards and make it current."""
    if launcher not in LAUNCHERS:
        raise GCUError(
            f"unknown launcher {launcher!r}: mmgcu supports {', '.join(LAUNCHERS)} "
            "(and 'none' for one process)"
        )
    rank = local_rank(launcher)
    cards = accelerator.device_count()
    ranks_here = local_world_size(launcher)
    kind = "GCU card(s)" if accelerator.is_gcu else f"{accelerator.device_type} device(s)"
    where = f"{cards} {accelerator.device_type} card(s) visible ({accelerator.description})"
    if cards == 0:
        raise GCUError(
            f"no card is visible to local rank {rank}: {where}; {describe_visible()}. List "
            "the cards to use (TOPS_VISIBLE_DEVICES=0,1,...) or unset the variable to use "
            "every card, and check that the driver sees the cards (efsmi)."
        )
    if ranks_here is not None and ranks_here > cards:
        raise GCUError(
            f"{ranks_here} ranks were launched on this node but it has only {cards} "
            f"{kind}: {where}. Launch at most {cards} processes per node "
            f"(torchrun --nproc_per_node={cards}, or mmgcu train CONFIG {cards}), "
            "or make more cards visible with TOPS_VISIBLE_DEVICES."
        )
    if not 0 <= rank < cards:
        raise GCUError(
            f"local rank {rank} has no card: {where}, so local ranks must be 0..{cards - 1}. "
            f"Launch at most {cards} processes per node, or check TOPS_VISIBLE_DEVICES."
        )
    accelerator.set_device(rank)
    return rank


def attempt_store(timeout: datetime.timedelta) -> dict:
    """On one node under torchrun's agent store, ``init_process_group`` arguments whose
    store keys are this attempt's own (``TORCHELASTIC_RESTART_COUNT``); elsewhere none.

    After a restart (``torchrun --max_restarts``), torch 2.x's workers meet again on the
    rendezvous store that the agent keeps across attempts, and its ``env://`` does not
    prefix their keys per attempt as torch 1.x's does, so gloo can read the address a
    peer of the previous attempt published ("Gloo connectFullMesh failed ... Connection
    refused"; pytorch/pytorch#135712). This is torch 1.x's prefix, given back. Only on one
    node: each node's agent counts its own restarts, so the counts of several nodes can
    differ (the same issue); there ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` for torchrun
    gives every attempt a store of its own.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    if os.environ.get("GROUP_WORLD_SIZE", "1") != "1":
        return {}
    world_size = int(os.environ["WORLD_SIZE"])
    client = torch_dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, False, timeout
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = torch_dist.PrefixStore(f"/worker/attempt_{attempt}", client)
    return dict(store=store, rank=int(os.environ["RANK"]), world_size=world_size)


def init_distributed(
    accelerator: Accelerator,
    launcher: str,
    pg_backend: Optional[str] = None,
    timeout: Optional[float] = None,
    port: Optional[int] = None,
    **kwargs,
) -> int:
    """Select this rank's card, then create the process groups. Returns the card."""
    if launcher == "slurm":
        set_slurm_env(port)
    elif launcher == "mpi":
        set_mpi_env(port)
    card = select_card(accelerator, launcher)
    pg_backend = pg_backend_for(pg_backend, accelerator)
    accelerator.check_collectives()
    timeout = DEFAULT_TIMEOUT_S if timeout is None else timeout
    kwargs["timeout"] = datetime.timedelta(seconds=timeout)
    if launcher == "pytorch" and "init_method" not in kwargs and "store" not in kwargs:
        kwargs.update(attempt_store(kwargs["timeout"]))
    accelerator.init_process_groups(pg_backend, **kwargs)
    return card
