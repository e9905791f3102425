"""Free TCP ports on loopback, for the servers runctl (and its tests) start.

A port the kernel hands out for ``bind(..., 0)`` is free again once that socket closes, so two picks made one after
the other can return the same number: :func:`free_ports` keeps every socket open until all are picked, so the ports
of one server (Ray's GCS and dashboard, a proxy and its upstream) are always distinct. Another process may still take
one before the server binds it; the server then fails to start and says which port.
"""

from __future__ import annotations

import contextlib
import socket

LOOPBACK = "127.0.0.1"


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct ports on ``host`` that were free a moment ago."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def free_port(host: str = LOOPBACK) -> int:
    return free_ports(1, host)[0]


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True
