"""Models torch_gcu/distributed/rendezvous.py of a 1.x release: torch_gcu's own store.

As there, ``rendezvous(url, rank, world_size)`` appends the ``rank`` and ``world_size``
it is given to the URL's query (asserting that the URL does not carry them already) and
hands the URL to the handler of its scheme (``tcp``, ``env``, ``file``), a generator that
yields ``(store, rank, world_size)`` once.

torch_gcu 1.x builds its stores from its own C++ classes. Under torchrun
(``TORCHELASTIC_USE_AGENT_STORE=True``) every rank is a client of the agent's store, as
torch.distributed's ranks are. Otherwise its rank 0 hosts a server at MASTER_PORT: one
that cannot share the port with a torch.distributed server in the same process, so the
simulator's server is not multi-tenant either and fails to bind there, as it would on a T20.
"""

import numbers
import os
from datetime import timedelta
from typing import Dict, Union
from urllib.parse import urlparse, urlunparse

import torch.distributed as _c10d  # the simulator's wire: torch's stores, gloo
from torch.distributed.constants import default_pg_timeout  # as in the 1.x source

_rendezvous_handlers = {}


def register_rendezvous_handler(scheme, handler):
    if scheme in _rendezvous_handlers:
        raise RuntimeError(f"Rendezvous handler for {scheme}:// already registered")
    _rendezvous_handlers[scheme] = handler


def _query(result) -> Dict[str, Union[int, str]]:
    return dict(pair.split("=") for pair in filter(None, result.query.split("&")))


def rendezvous(url: str, rank: int = -1, world_size: int = -1, **kwargs):
    """The handler's iterator for ``url`` with node-specific arguments appended."""
    if not isinstance(url, str):
        raise RuntimeError(f"`url` must be a string. {type(url)}: {url}")
    if not isinstance(rank, numbers.Integral):
        raise RuntimeError(f"`rank` must be an integer. {rank}")
    if not isinstance(world_size, numbers.Integral):
        raise RuntimeError(f"`world_size` must be an integer. {world_size}")
    result = urlparse(url)
    if rank != -1 or world_size != -1:
        query = _query(result)
        assert "rank" not in query and "world_size" not in query, (
            f"The url: {url} has node-specific arguments(rank, world_size) already."
        )
        if rank != -1:
            query["rank"] = rank
        if world_size != -1:
            query["world_size"] = world_size
        result = result._replace(query="&".join(f"{k}={v}" for k, v in query.items()))
        url = urlunparse(result)
    if result.scheme not in _rendezvous_handlers:
        raise RuntimeError(f"No rendezvous handler for {result.scheme}://")
    return _rendezvous_handlers[result.scheme](url, **kwargs)


def _rendezvous_error(msg):
    return ValueError("Error initializing torch.distributed using " + msg)


def _rank_and_size(query, error):
    if "rank" not in query:
        raise error("rank parameter missing")
    if "world_size" not in query:
        raise error("world size parameter missing")
    return int(query["rank"]), int(query["world_size"])


def _file_rendezvous_handler(url: str, **kwargs):
    def _error(msg):
        return _rendezvous_error("file:// rendezvous: " + msg)

    result = urlparse(url)
    if not result.path:
        raise _error("path missing")
    rank, world_size = _rank_and_size(_query(result), _error)
    yield _c10d.FileStore(result.path, world_size), rank, world_size
    raise RuntimeError("Unable to perform rerendezvous using file:// method")


def _torchelastic_use_agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", None) == str(True)


def _create_c10d_store(hostname, port, rank, world_size, timeout):
    if _torchelastic_use_agent_store():
        attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
        store = _c10d.TCPStore(hostname, port, world_size, False, timeout)
        return _c10d.PrefixStore(f"/worker/attempt_{attempt}", store)
    return _c10d.TCPStore(hostname, port, world_size, rank == 0, timeout)


def _tcp_rendezvous_handler(url: str, timeout: timedelta = default_pg_timeout, **kwargs):
    def _error(msg):
        return _rendezvous_error("tcp:// rendezvous: " + msg)

    result = urlparse(url)
    if not result.port:
        raise _error("port number missing")
    rank, world_size = _rank_and_size(_query(result), _error)
    assert result.hostname is not None
    store = _create_c10d_store(result.hostname, result.port, rank, world_size, timeout)
    yield store, rank, world_size
    raise RuntimeError("Unable to perform re-rendezvous using tcp:// method")


def _env_or_raise(name: str) -> str:
    value = os.environ.get(name, None)
    if not value:
        raise _rendezvous_error(
            f"env:// rendezvous: environment variable {name} expected, but not set"
        )
    return value


def _env_rendezvous_handler(url: str, timeout: timedelta = default_pg_timeout, **kwargs):
    query = _query(urlparse(url))
    rank = int(query["rank"]) if "rank" in query else int(_env_or_raise("RANK"))
    world_size = (
        int(query["world_size"]) if "world_size" in query else int(_env_or_raise("WORLD_SIZE"))
    )
    host, port = _env_or_raise("MASTER_ADDR"), int(_env_or_raise("MASTER_PORT"))
    yield _create_c10d_store(host, port, rank, world_size, timeout), rank, world_size
    raise RuntimeError("Unable to perform re-rendezvous using env:// method")


register_rendezvous_handler("tcp", _tcp_rendezvous_handler)
register_rendezvous_handler("env", _env_rendezvous_handler)
register_rendezvous_handler("file", _file_rendezvous_handler)
