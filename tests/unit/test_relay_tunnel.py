"""The relay over a stream (``relay.py … -``) and the runner's end of it (``tunnel.py``), with the real relay as a
child process whose stdin and stdout are the stream, as a pod's exec makes them: connections carried both ways,
many at once, each end's half-close kept, a dial that fails closing only that connection, the relay ending with its
stream, and a stream that stops speaking the protocol ending the tunnel without dialling anything else."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from runctl.ports import free_port
from services.launcher.rollout.agents import relay
from services.launcher.rollout.agents.relay import FRAME, MAX_FRAME, Mux, ProtocolError
from services.launcher.rollout.agents.tunnel import Tunnel
from tests.conftest import wait_until


class PipeStream:
    """A child process's stdin and stdout as an ExecStream."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        assert proc.stdin is not None and proc.stdout is not None
        self.stdin, self.stdout = proc.stdin, proc.stdout

    def write(self, data: bytes) -> None:
        self.stdin.write(data)
        self.stdin.flush()

    def read(self, timeout_s: float) -> bytes | None:
        ready, _, _ = select.select([self.stdout], [], [], timeout_s)
        if not ready:
            return b""
        return os.read(self.stdout.fileno(), 1 << 16) or None

    def close(self) -> None:
        try:
            self.stdin.close()
        except OSError:
            pass


class Upstream:
    """A Unix socket server standing in for the proxy: reads a request to its end, answers ``got N`` and a body."""

    def __init__(self, path: Path) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(64)
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    @staticmethod
    def _answer(conn: socket.socket) -> None:
        got = b""
        while data := conn.recv(1 << 16):
            got += data
        conn.sendall(b"got %d " % len(got) + got[::-1])
        conn.close()


@pytest.fixture
def carried(tmp_path: Path) -> Iterator[tuple[int, Tunnel, Upstream, subprocess.Popen[bytes]]]:
    """The relay on a free loopback port, its stream tunnelled to an upstream on a Unix socket."""
    port, ready = free_port(), tmp_path / "ready"
    argv = [sys.executable, relay.__file__, f"127.0.0.1:{port}", "-", str(ready)]
    upstream = Upstream(tmp_path / "proxy.sock")
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        try:
            wait_until(ready.exists, 30, "the relay did not start")
            with Tunnel(PipeStream(proc), tmp_path / "proxy.sock") as tunnel:
                yield port, tunnel, upstream, proc
        finally:
            proc.kill()
            upstream.server.close()


def ask(port: int, body: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(body)
        sock.shutdown(socket.SHUT_WR)  # the half-close travels: the upstream answers once it sees the end
        answer = b""
        while data := sock.recv(1 << 16):
            answer += data
    return answer


def test_connections_travel_both_ways_many_at_once_and_end_with_the_stream(
    carried: tuple[int, Tunnel, Upstream, subprocess.Popen[bytes]],
) -> None:
    port, tunnel, upstream, proc = carried
    # Large bodies both ways at once fill every pipe on the way: neither end may wait on the other's reading.
    bodies = [os.urandom(n) for n in (0, 1, 70_000, 3 << 20, 1 << 20, 1 << 20, 1 << 20)] + [
        b"x%d" % i for i in range(12)
    ]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda body: ask(port, body), bodies))
    assert answers == [b"got %d " % len(body) + body[::-1] for body in bodies]
    assert upstream.accepted == len(bodies) and tunnel.error is None
    tunnel.close()
    assert proc.wait(timeout=30) == 0  # its stdin closed: the relay ends with its stream


def test_a_connection_the_runner_cannot_dial_is_closed_alone(
    carried: tuple[int, Tunnel, Upstream, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    port, tunnel, upstream, _ = carried
    (tmp_path / "proxy.sock").rename(tmp_path / "moved.sock")  # the proxy's socket is gone
    assert ask(port, b"hello") == b""
    (tmp_path / "moved.sock").rename(tmp_path / "proxy.sock")
    assert ask(port, b"again") == b"got 5 niaga" and tunnel.error is None


class ScriptedStream:
    """A stream whose far end sends ``frames`` once, then nothing; what the tunnel writes back is kept."""

    def __init__(self, frames: bytes) -> None:
        self.pending, self.written, self.closed = frames, b"", False

    def write(self, data: bytes) -> None:
        self.written += data

    def read(self, timeout_s: float) -> bytes | None:
        if self.closed:
            return None
        data, self.pending = self.pending, b""
        if not data:
            time.sleep(min(timeout_s, 0.05))
        return data

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    "frames",
    [
        FRAME.pack(b"D", 1, MAX_FRAME + 1),  # a length no end sends: not read, however long it would take
        FRAME.pack(b"X", 1, 0),  # a kind that does not exist
        b"GET / HTTP/1.1\r\nHost: runner\r\n\r\n",  # anything else written on the relay's output
    ],
    ids=["oversized", "unknown-kind", "not-frames"],
)
def test_a_stream_that_stops_speaking_the_protocol_ends_the_tunnel_and_dials_nothing(
    frames: bytes, tmp_path: Path
) -> None:
    upstream = Upstream(tmp_path / "proxy.sock")
    try:
        stream = ScriptedStream(FRAME.pack(b"O", 7, 0) + frames)
        with Tunnel(stream, tmp_path / "proxy.sock") as tunnel:
            wait_until(lambda: tunnel.error is not None, 30, "the tunnel went on")
        assert "not a relay frame" in str(tunnel.error)
        assert upstream.accepted <= 1  # the open before it dialled the proxy's socket, and nothing else
    finally:
        upstream.server.close()


def test_frames_split_anywhere_are_read_whole() -> None:
    got: list[bytes] = []
    done = threading.Event()

    class Sink:
        def sendall(self, data: bytes) -> None:
            got.append(data)

        def shutdown(self, how: int) -> None:
            got.append(b"<eof>")

        def close(self) -> None:
            pass

        def recv(self, n: int) -> bytes:
            done.wait()  # the far side sends nothing until the test ends
            return b""

    mux = Mux(lambda data: None, dial=lambda: Sink())  # type: ignore[arg-type, return-value]
    stream = FRAME.pack(b"O", 1, 0) + FRAME.pack(b"D", 1, 5) + b"hello" + FRAME.pack(b"C", 1, 0)
    for i in range(len(stream)):
        mux.feed(stream[i : i + 1])
    wait_until(lambda: len(got) == 2, 10, "the frames' bytes and end delivered")
    assert got == [b"hello", b"<eof>"]
    with pytest.raises(ProtocolError):
        mux.feed(FRAME.pack(b"D", 1, MAX_FRAME + 1))
    done.set()
