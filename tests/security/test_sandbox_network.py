"""Attacks from a bubblewrap sandbox that may reach out (network ``public``) on what listens on the runner's machine:
its loopback (where vLLM replicas, the proxy, the tracker and a Ray head listen) and the host itself through the
sandbox's gateway. The sandbox has a network namespace of its own (services/sandbox/backends/netns.py)."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.sandbox.backends import netns
from services.sandbox.backends.base import Sandbox, SandboxSpec
from services.sandbox.backends.local_backend import LocalBackend

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(netns.public_net_problem() is not None, reason=str(netns.public_net_problem())),
]

PROBE = """
import socket, sys
s = socket.socket()
s.settimeout(float(sys.argv[3]))
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    s.sendall(b"from the sandbox\\n")
    print("connected")
except ConnectionRefusedError:
    print("refused")
except (TimeoutError, socket.timeout):
    print("timeout")
except OSError as e:
    print("error", e.errno)
"""


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A server on the runner's loopback, as a vLLM replica's: what reaches it is recorded."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    heard: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                heard.append(conn.recv(100))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], heard
    server.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone leaves it blocked)
    server.close()
    thread.join(timeout=5)


@pytest.fixture
def public(tmp_path: Path) -> Iterator[tuple[LocalBackend, Sandbox]]:
    backend = LocalBackend(root=tmp_path / "sandboxes")
    sandbox = backend.create(SandboxSpec(f"net-{uuid.uuid4().hex[:10]}", None, network="public", memory_mb=256))
    yield backend, sandbox
    backend.destroy(sandbox)


def probe(backend: LocalBackend, sandbox: Sandbox, host: str, port: int, timeout_s: float = 3.0) -> str:
    script = Path(sandbox.handle) / "tmp" / "probe.py"
    script.write_text(PROBE)
    done = backend.exec(sandbox, f"python3 /tmp/probe.py {host} {port} {timeout_s}", 30)
    assert done.exit_code == 0, done
    return done.stdout.strip()


def the_net(sandbox: Sandbox) -> netns.SandboxNet:
    record = json.loads((Path(sandbox.handle) / "meta.json").read_text())["net"]
    return netns.SandboxNet.from_record(record)


def test_a_public_sandbox_cannot_reach_the_runners_loopback(
    public: tuple[LocalBackend, Sandbox], listener: tuple[int, list[bytes]]
) -> None:
    backend, sandbox = public
    port, heard = listener
    assert probe(backend, sandbox, "127.0.0.1", port) == "refused"  # its own loopback: nothing listens there
    assert heard == []


def test_a_public_sandbox_cannot_reach_the_host_through_its_gateway(
    public: tuple[LocalBackend, Sandbox], listener: tuple[int, list[bytes]]
) -> None:
    """Without the host's INPUT rule the gateway would answer at once (refused: the server is on loopback only);
    with it nothing comes back."""
    backend, sandbox = public
    port, heard = listener
    assert probe(backend, sandbox, the_net(sandbox).gateway, port, timeout_s=2.0) == "timeout"
    assert heard == []


def test_a_public_sandbox_has_a_route_out_and_its_network_goes_with_it(public: tuple[LocalBackend, Sandbox]) -> None:
    backend, sandbox = public
    net = the_net(sandbox)
    routes = backend.exec(sandbox, "cat /proc/net/route", 30).stdout.splitlines()[1:]
    assert any(line.split()[1] == "00000000" for line in routes), routes  # a default route, via its gateway
    assert netns.present(net)
    backend.destroy(sandbox)
    assert not netns.present(net)  # namespace, veth pair and every tagged rule are gone


def test_a_no_network_sandbox_still_has_only_its_loopback(tmp_path: Path) -> None:
    backend = LocalBackend(root=tmp_path / "sandboxes")
    sandbox = backend.create(SandboxSpec(f"net-{uuid.uuid4().hex[:10]}", None, memory_mb=256))
    try:
        assert backend.exec(sandbox, "cat /proc/net/route", 30).stdout.splitlines()[1:] == []
        assert "net" not in json.loads((Path(sandbox.handle) / "meta.json").read_text())
    finally:
        backend.destroy(sandbox)
