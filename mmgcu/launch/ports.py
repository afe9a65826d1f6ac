"""TCP ports for a job's own store (torchrun's rendezvous, torch_gcu 1.x's ECCL store).

A port the kernel hands out for ``bind(0)`` lies in its range for outgoing connections
(``ip_local_port_range``, 32768-60999 by default). Between its choice and the store's bind,
any connection another job opens may take it, and the store fails with ``EADDRINUSE``
(``The server socket has failed to listen on any local network address``). So the port is
drawn at random below that range, where only a listener can hold it, and checked free.
A port the user gives is checked for a listener (:func:`port_in_use`).
"""

import random
import socket

#: The lowest port drawn (above the registered services most hosts run).
PORT_FLOOR = 20000
_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_TRIES = 50


def outgoing_range_start() -> int:
    """The first port of the kernel's range for outgoing connections (Linux's default where
    it cannot be read)."""
    try:
        with open(_RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port no socket of this host holds now, below the outgoing range where it can."""
    top = outgoing_range_start()
    draw = random.SystemRandom()  # not the seeded module-level generator: jobs would agree
    for _ in range(_TRIES if top > PORT_FLOOR else 0):
        port = draw.randrange(PORT_FLOOR, top)
        if _bindable(port):
            return port
    with socket.socket() as s:  # no room below the range: the kernel's choice
        s.bind(("", 0))
        return s.getsockname()[1]


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def port_in_use(port: int) -> bool:
    """Whether a TCP port of this host has a listener (another job's store). A job that
    just ended (its connections in TIME_WAIT) does not count: the store reuses the address."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False
