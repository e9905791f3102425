"""Docker's exec stream as the docker backend reads it: the bytes the HTTP client read ahead into its own buffer
with the upgrade response are part of the output (a fast ``tar -c`` on a loaded machine arrives there whole)."""

from __future__ import annotations

import socket
import struct
import time
from types import SimpleNamespace

from services.sandbox.backends.docker_backend import _demux_until, _read_ahead
from services.sandbox.backends.execio import Capture


def frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


def test_output_the_http_client_read_ahead_is_not_lost() -> None:
    ours, daemon = socket.socketpair()
    try:
        daemon.sendall(frame(1, b"archive-" * 2000) + frame(2, b"warning\n"))
        daemon.close()  # the command ended: all of its output is in flight
        reader = ours.makefile("rb")
        reader.peek(1)  # what http.client does reading the upgrade response: the output lands in its buffer
        raw = SimpleNamespace(_response=SimpleNamespace(raw=SimpleNamespace(_fp=SimpleNamespace(fp=reader))))
        ahead = _read_ahead(raw, ours)
        assert ahead, "the buffered bytes were not found"
        out, err = Capture(1 << 20), Capture(1 << 20)
        assert _demux_until(ours, time.monotonic() + 5, out, err, ahead)
        assert bytes(out.data) == b"archive-" * 2000 and bytes(err.data) == b"warning\n"
    finally:
        ours.close()


def test_with_nothing_read_ahead_the_socket_is_read_as_before() -> None:
    ours, daemon = socket.socketpair()
    try:
        raw = SimpleNamespace(
            _response=SimpleNamespace(raw=SimpleNamespace(_fp=SimpleNamespace(fp=ours.makefile("rb"))))
        )
        assert _read_ahead(raw, ours) == b""
        assert _read_ahead(object(), ours) == b""
        daemon.sendall(frame(1, b"hello\n"))
        daemon.close()
        out, err = Capture(1024), Capture(1024)
        assert _demux_until(ours, time.monotonic() + 5, out, err)
        assert bytes(out.data) == b"hello\n"
    finally:
        ours.close()
