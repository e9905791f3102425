"""Can an address be connected to? A plain-socket check before a client library tries (some leave failed
sockets open, or retry for a long time)."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit


def socket_unreachable(address: str, timeout_s: float = 5.0) -> str | None:
    """Why a ``unix://`` or ``tcp://`` address cannot be connected to, or None when it can.

    Checked with a plain socket before a client library connects (Docker's leaves failed sockets open).
    """
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        if parts.scheme in ("unix", "http+unix"):
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(timeout_s)
                sock.connect(parts.path)
        else:
            with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 2375), timeout_s):
                pass
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return None
