"""The port of a job's own store: drawn below the kernel's range for outgoing connections."""

import socket

from mmgcu.launch import ports


def test_a_port_below_the_outgoing_range_that_a_store_can_listen_on():
    top = ports.outgoing_range_start()
    drawn = {ports.free_port() for _ in range(20)}
    assert all(ports.PORT_FLOOR <= port < top for port in drawn), (drawn, top)
    assert len(drawn) > 1  # drawn at random: two jobs starting together do not agree
    with socket.socket() as s:
        s.bind(("127.0.0.1", drawn.pop()))
        s.listen()


def test_a_port_held_by_a_listener_is_not_drawn(monkeypatch):
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        taken = held.getsockname()[1]
        draws = iter([taken, taken + 1 if taken + 1 != 65536 else taken - 1])
        monkeypatch.setattr(ports.random.SystemRandom, "randrange", lambda self, a, b: next(draws))
        assert ports.free_port() != taken


def test_without_room_below_the_range_the_kernel_chooses(tmp_path, monkeypatch):
    table = tmp_path / "ip_local_port_range"
    table.write_text("1024\t60999\n")
    monkeypatch.setattr(ports, "_RANGE_FILE", str(table))
    assert ports.outgoing_range_start() == 1024
    port = ports.free_port()
    assert 1024 <= port <= 65535


def test_a_given_port_is_in_use_while_a_store_listens_on_it():
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        assert ports.port_in_use(port)
    assert not ports.port_in_use(port)
