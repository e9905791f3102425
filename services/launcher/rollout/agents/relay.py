"""Relay TCP connections on a loopback address to the proxy (standard library only).

It runs inside a sandbox that has no network but loopback, next to an agent, so that the agent can reach the proxy
at ``http://127.0.0.1:PORT`` — and only the proxy. Two ways, one per kind of backend:

- ``python relay.py 127.0.0.1:PORT /runctl/proxy/proxy.sock READY_FILE``: each connection is carried to the proxy's
  Unix socket, whose folder the runner binds into the sandbox (local and Docker sandboxes).
- ``python relay.py 127.0.0.1:PORT - READY_FILE``: each connection is carried over the relay's own stdin and stdout
  (a pod's exec stream, where nothing of the runner's machine can be bound), as frames that
  :class:`Mux` reads and writes on both ends; the runner's end (``tunnel.py``) dials the proxy's socket for each.

Either way it writes ``READY_FILE`` once listening. A frame is a kind (open, data, close: no more data this way), a
connection number and a length, then that many bytes; a frame longer than :data:`MAX_FRAME` or of no known kind
ends the relay (the other end is not speaking this protocol).
"""

from __future__ import annotations

import os
import queue
import socket
import struct
import sys
import threading
from collections.abc import Callable
from pathlib import Path

FRAME = struct.Struct(">cII")
OPEN, DATA, CLOSE = b"O", b"D", b"C"
#: The longest frame either end accepts; each end sends at most :data:`CHUNK` bytes a frame.
MAX_FRAME = 1 << 20
CHUNK = 1 << 16


class ProtocolError(Exception):
    """Bytes that are not frames of this protocol."""


def pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def dial(path: str) -> socket.socket | None:
    """A connection to the Unix socket at ``path`` (the proxy's), or None when it cannot be made."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def serve(client: socket.socket, path: str) -> None:
    upstream = dial(path)
    if upstream is None:
        client.close()
        return
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


class _Conn:
    """One carried connection: its socket, what the other end sent for it (queued, so that the stream's reader
    never waits on one slow socket), and which ways have ended."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()  # None: the other end sends no more
        self.ended: set[str] = set()  # "sent" / "got"


class Mux:
    """One end of a stream that carries many connections as frames.

    ``write`` sends bytes to the other end (called under a lock, from any thread). ``dial``, on the end that opens
    no connections of its own (the runner's), makes the socket for a connection the other end opened, or returns
    None when it cannot. :meth:`feed` takes the bytes that arrive from the other end, in any pieces; it never waits
    on a connection's socket or on the stream's other direction (each connection has a thread that reads its socket
    and one that writes to it), so neither end can stall the other's reading.
    """

    def __init__(self, write: Callable[[bytes], None], dial: Callable[[], socket.socket | None] | None = None) -> None:
        self._write = write
        self._dial = dial
        self._out = threading.Lock()  # one frame at a time on the stream
        self._lock = threading.Lock()  # the table of connections
        self._buffer = bytearray()
        self._conns: dict[int, _Conn] = {}

    def send(self, kind: bytes, conn: int, payload: bytes = b"") -> None:
        with self._out:
            self._write(FRAME.pack(kind, conn, len(payload)) + payload)

    def attach(self, conn: int, sock: socket.socket, announce: bool = False) -> None:
        """Carry ``sock`` as connection ``conn``, on threads of its own; ``announce``: tell the other end first that
        the connection is opened (the end that accepts it)."""
        carried = _Conn(sock)
        with self._lock:
            self._conns[conn] = carried
        if announce:
            self.send(OPEN, conn)
        threading.Thread(target=self._carry, args=(conn, carried), daemon=True).start()
        threading.Thread(target=self._deliver, args=(conn, carried), daemon=True).start()

    def _carry(self, conn: int, carried: _Conn) -> None:
        """The socket's bytes out as frames, then its end."""
        try:
            while data := carried.sock.recv(CHUNK):
                self.send(DATA, conn, data)
        except OSError:
            pass
        try:
            self.send(CLOSE, conn)
        except OSError:
            return  # the stream is gone: the relay is ending
        self._ended(conn, carried, "sent")

    def _deliver(self, conn: int, carried: _Conn) -> None:
        """The other end's bytes into the socket, then its end."""
        while (data := carried.inbox.get()) is not None:
            try:
                carried.sock.sendall(data)
            except OSError:
                pass  # gone: what is still queued is dropped
        try:
            carried.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._ended(conn, carried, "got")

    def _ended(self, conn: int, carried: _Conn, way: str) -> None:
        with self._lock:
            carried.ended.add(way)
            done = len(carried.ended) == 2
            if done and self._conns.get(conn) is carried:
                del self._conns[conn]
        if done:
            carried.sock.close()

    def feed(self, data: bytes) -> None:
        """Act on every whole frame that ``data`` completes.

        Raises:
            ProtocolError: a frame of no known kind, or longer than :data:`MAX_FRAME`.
        """
        self._buffer += data
        while len(self._buffer) >= FRAME.size:
            kind, conn, size = FRAME.unpack_from(self._buffer)
            if kind not in (OPEN, DATA, CLOSE) or size > MAX_FRAME:
                raise ProtocolError(f"not a relay frame (kind {kind!r}, {size} bytes)")
            if len(self._buffer) < FRAME.size + size:
                return
            payload = bytes(self._buffer[FRAME.size : FRAME.size + size])
            del self._buffer[: FRAME.size + size]
            self._act(kind, conn, payload)

    def _act(self, kind: bytes, conn: int, payload: bytes) -> None:
        with self._lock:
            carried = self._conns.get(conn)
        if kind == OPEN:
            sock = self._dial() if self._dial is not None and carried is None else None
            if sock is None:
                # Refused: the other end closes its side. Sent from a thread of its own, as the reader never waits
                # on the stream's other direction.
                threading.Thread(target=self._refuse, args=(conn,), daemon=True).start()
                return
            self.attach(conn, sock)
            return
        if carried is not None:  # else a connection already gone
            carried.inbox.put(payload if kind == DATA else None)

    def _refuse(self, conn: int) -> None:
        try:
            self.send(CLOSE, conn)
        except OSError:
            pass

    def close(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for carried in conns:
            carried.inbox.put(None)
            carried.sock.close()


def _write_all(fd: int) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    return write


def _carry_stdin(mux: Mux) -> None:
    """Feed the stream's frames to ``mux`` until the runner's end goes; then the relay ends."""
    try:
        while data := os.read(0, CHUNK):
            mux.feed(data)
    except (OSError, ProtocolError) as e:
        print(f"relay: {e}", file=sys.stderr)
    os._exit(0)


def main(argv: list[str]) -> int:
    address, path, ready = argv[1], argv[2], argv[3]
    host, port = address.rsplit(":", 1)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, int(port)))
    listener.listen(128)
    mux = None
    if path == "-":
        mux = Mux(_write_all(1))
        threading.Thread(target=_carry_stdin, args=(mux,), daemon=True).start()
    Path(ready).write_text("ready\n")
    conn = 0
    while True:
        client, _ = listener.accept()
        if mux is None:
            threading.Thread(target=serve, args=(client, path), daemon=True).start()
            continue
        conn += 1
        mux.attach(conn, client, announce=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
