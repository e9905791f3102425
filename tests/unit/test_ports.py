"""Free ports for the servers runctl starts (runctl/ports.py)."""

from __future__ import annotations

import socket

from runctl.ports import free_ports, port_is_free


def test_ports_picked_together_are_distinct_and_free() -> None:
    ports = free_ports(64)
    assert len(set(ports)) == 64 and all(port_is_free(p) for p in ports)


def test_a_bound_port_is_not_free() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert not port_is_free(sock.getsockname()[1])
