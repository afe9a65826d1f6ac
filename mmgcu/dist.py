"""Process-group set-up on GCU cards, for the ``pytorch``, ``slurm`` and ``mpi`` launchers.

Stock ``mmengine.dist.init_dist`` calls ``torch.cuda.set_device`` (seed 002: "Found no
NVIDIA driver"). Here each rank's card is chosen and checked first, then the group is
created with the backend of the torch_gcu generation.
"""

import datetime
import os
import subprocess
from typing import Optional

import torch.distributed as torch_dist

from .device import DeviceBackend, GCUError

LAUNCHERS = ("pytorch", "slurm", "mpi")

# The group that carries card tensors when the default group cannot (legacy ECCL).
_device_group = None


def device_group():
    """The process group for card tensors (DDP, SyncBN); None means the default group."""
    return _device_group


# How a collective reports a peer process that has gone (gloo's TCP transport; the
# simulated ECCL runs over it). torch >= 2.1 device backends raise ``DistError``.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective failing because another rank has stopped.

    Such a rank is a casualty: the error worth reading is the other rank's.
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


def resolve_backend(requested: Optional[str], backend: DeviceBackend) -> str:
    """The ``init_process_group`` backend for a ``dist_cfg.backend`` on this device.

    ``nccl`` (mmseg's default_runtime) and ``eccl`` mean "the device's backend". ``gloo``
    cannot carry card tensors: where the default group must carry them (torch_gcu 2.x) it
    is refused; where card tensors have their own ECCL group (1.x) it is what mmgcu uses.
    """
    if requested in (None, "", "auto", "nccl", "eccl"):
        if requested == "eccl" and not backend.is_gcu:
            raise GCUError(
                f"env_cfg.dist_cfg.backend='eccl' but no GCU was found ({backend.description})"
            )
        return backend.default_group_backend
    if backend.is_gcu and requested == "gloo" and backend.device_group_backend is None:
        raise GCUError(
            "env_cfg.dist_cfg.backend='gloo' cannot carry GCU tensors: gradients would "
            "not be synchronised on the cards. Remove dist_cfg.backend (mmgcu picks "
            f"'{backend.default_group_backend}') or set it to 'eccl'."
        )
    return requested


def _require(launcher: str, names) -> None:
    missing = [n for n in names if n not in os.environ]
    if missing:
        how = {"slurm": "srun", "mpi": "mpirun"}[launcher]
        raise GCUError(
            f"--launcher {launcher} but {', '.join(missing)} is not set: start the job "
            f"with {how} (tools/slurm_train.sh for slurm), or use --launcher pytorch "
            "under torchrun."
        )


def _set_slurm_env(port: Optional[int]) -> None:
    _require("slurm", ("SLURM_PROCID", "SLURM_NTASKS"))
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ.setdefault("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))
    if port is not None:
        os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("MASTER_PORT", "29500")
    if "MASTER_ADDR" not in os.environ:
        _require("slurm", ("SLURM_NODELIST",))
        nodes = os.environ["SLURM_NODELIST"]
        os.environ["MASTER_ADDR"] = subprocess.getoutput(
            f"scontrol show hostname {nodes} | head -n1"
        )


def _set_mpi_env(port: Optional[int]) -> None:
    _require("mpi", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"))
    os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
    os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    os.environ["LOCAL_RANK"] = os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]
    if port is not None:
        os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")


def select_card(backend: DeviceBackend, launcher: str) -> int:
    """Check this rank's card against the node's cards and make it current."""
    if launcher not in LAUNCHERS:
        raise GCUError(
            f"unknown launcher {launcher!r}: mmgcu supports {', '.join(LAUNCHERS)} "
            "(and 'none' for one process)"
        )
    rank = local_rank(launcher)
    cards = backend.device_count()
    ranks_here = local_world_size(launcher)
    kind = "GCU card(s)" if backend.is_gcu else f"{backend.device_type} device(s)"
    where = f"{cards} {backend.device_type} card(s) visible ({backend.description})"
    if cards == 0:
        raise GCUError(
            f"no card is visible to local rank {rank}: {where}. Check "
            "TOPS_VISIBLE_DEVICES and that the driver sees the cards (efsmi)."
        )
    if ranks_here is not None and ranks_here > cards:
        raise GCUError(
            f"{ranks_here} ranks were launched on this node but it has only {cards} "
            f"{kind}: {where}. Launch at most {cards} processes per node "
            f"(torchrun --nproc_per_node={cards}, or tools/dist_train.sh CONFIG {cards}), "
            "or make more cards visible with TOPS_VISIBLE_DEVICES."
        )
    if not 0 <= rank < cards:
        raise GCUError(
            f"local rank {rank} has no card: {where}, so local ranks must be 0..{cards - 1}. "
            f"Launch at most {cards} processes per node, or check TOPS_VISIBLE_DEVICES."
        )
    backend.set_device(rank)
    return rank


def init_distributed(
    backend: DeviceBackend,
    launcher: str,
    dist_backend: Optional[str] = None,
    timeout: Optional[float] = None,
    port: Optional[int] = None,
    **kwargs,
) -> int:
    """Select this rank's card, then create the process group(s). Returns the card."""
    if launcher == "slurm":
        _set_slurm_env(port)
    elif launcher == "mpi":
        _set_mpi_env(port)
    card = select_card(backend, launcher)
    group_backend = resolve_backend(dist_backend, backend)
    if backend.is_gcu:
        backend.check_dist_backend()
    if timeout is not None:
        kwargs["timeout"] = datetime.timedelta(seconds=timeout)
    dist = backend.import_distributed()
    dist.init_process_group(backend=group_backend, **kwargs)
    global _device_group
    if backend.device_group_backend:
        _device_group = torch_dist.new_group(
            backend=backend.device_group_backend, timeout=kwargs.get("timeout")
        )
    return card
