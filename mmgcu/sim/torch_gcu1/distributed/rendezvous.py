"""Models torch_gcu/distributed/rendezvous.py of a 1.x release: torch_gcu's own store.

torch_gcu 1.x builds its stores from its own C++ classes. Under torchrun
(``TORCHELASTIC_USE_AGENT_STORE=True``) every rank is a client of the agent's store, as
torch.distributed's ranks are. Otherwise its rank 0 hosts a server at MASTER_PORT: one
that cannot share the port with a torch.distributed server in the same process, so the
simulator's server is not multi-tenant either and fails to bind there, as it would on a T20.
"""

import datetime
import os
from typing import Dict
from urllib.parse import urlparse

import torch.distributed as _c10d  # the simulator's wire: torch's stores, gloo


def _torchelastic_use_agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", None) == str(True)


def _create_c10d_store(hostname, port, rank, world_size, timeout):
    if _torchelastic_use_agent_store():
        attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
        store = _c10d.TCPStore(hostname, port, world_size, False, timeout)
        return _c10d.PrefixStore(f"/worker/attempt_{attempt}", store)
    return _c10d.TCPStore(hostname, port, world_size, rank == 0, timeout)


def _query(url) -> Dict[str, str]:
    return dict(pair.split("=") for pair in filter(None, urlparse(url).query.split("&")))


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise ValueError(
            f"Error initializing torch.distributed using env:// rendezvous: "
            f"environment variable {name} expected, but not set"
        )
    return value


def rendezvous(url: str, rank: int = -1, world_size: int = -1, timeout=None):
    """The store, rank and world size of ``env://`` or ``tcp://host:port?rank=R&world_size=W``."""
    timeout = timeout or datetime.timedelta(minutes=30)
    result = urlparse(url)
    query = _query(url)
    if result.scheme == "tcp":
        if not result.port:
            raise ValueError("tcp:// rendezvous: port number missing")
        rank, world_size = int(query["rank"]), int(query["world_size"])
        host, port = result.hostname, result.port
    elif result.scheme == "env":
        rank = int(query.get("rank", _env("RANK")))
        world_size = int(query.get("world_size", _env("WORLD_SIZE")))
        host, port = _env("MASTER_ADDR"), int(_env("MASTER_PORT"))
    else:
        raise RuntimeError(f"No rendezvous handler for {result.scheme}://")
    store = _create_c10d_store(host, port, rank, world_size, timeout)
    return store, rank, world_size
