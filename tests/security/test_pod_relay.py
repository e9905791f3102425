"""Attacks from a pod on the relay that carries its agent's connections to the proxy over an exec stream
(``BACKEND=k8s``: the fake API server, whose pods are Docker containers; the runner's end is ``tunnel.py``).

The agent runs as root in its pod, beside the relay: it can write to the relay's output (its exec's stdout) and so
send the runner any bytes it likes. What that must not buy it: a connection to anything but the proxy's socket (the
frames carry no address), memory on the runner's side (a frame's length is checked before it is read), or anything
beyond its own tunnel, which ends."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.launcher.rollout.agents.relay import FRAME
from services.launcher.rollout.agents.tunnel import Tunnel
from services.sandbox.backends.base import SandboxSpec
from services.sandbox.backends.kubernetes_backend import KubernetesBackend
from tests.conftest import wait_until
from tests.infra.docker_daemon import BASE_IMAGE
from tests.infra.kube_api import FakeCluster, fake_kube_api

pytestmark = pytest.mark.integration


@pytest.fixture
def pod_backend(docker_host: str, tmp_path: Path) -> Iterator[KubernetesBackend]:
    with fake_kube_api(FakeCluster(docker_host=docker_host)) as api:
        backend = KubernetesBackend(kubeconfig=str(api.kubeconfig(tmp_path)), namespace="runctl", startup_timeout_s=60)
        yield backend
        assert backend.list_owned() == []
        backend.close()


def octal(data: bytes) -> str:
    """``data`` as printf's octal escapes (busybox's printf has no \\x)."""
    return "".join(f"\\{b:03o}" for b in data)


def test_an_agent_that_forges_the_relays_frames_ends_its_own_tunnel_and_dials_only_the_proxy(
    pod_backend: KubernetesBackend, tmp_path: Path
) -> None:
    proxy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    proxy.bind(str(tmp_path / "proxy.sock"))
    proxy.listen(8)
    dialled: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = proxy.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                try:
                    dialled.append(conn.recv(64))
                except OSError:
                    dialled.append(b"")

    threading.Thread(target=serve, daemon=True).start()
    sandbox = pod_backend.create(SandboxSpec(f"sec-{uuid.uuid4().hex[:8]}", BASE_IMAGE, memory_mb=64))
    try:
        # The relay's place: a process whose output is the tunnel. The agent finds it and writes its own frames
        # there: a connection opened with data for it, then a frame claiming 4 GiB.
        stream = pod_backend.attach(sandbox, ["sh", "-c", "echo $$ > /tmp/relay.pid; exec sleep 100000"])
        with Tunnel(stream, tmp_path / "proxy.sock") as tunnel:
            wait_until(lambda: pod_backend.exec(sandbox, "cat /tmp/relay.pid", 10).stdout.strip() != "", 30, "no relay")
            relay_out = "/proc/$(cat /tmp/relay.pid)/fd/1"
            forged = FRAME.pack(b"O", 1, 0) + FRAME.pack(b"D", 1, 6) + b"forged"
            assert pod_backend.exec(sandbox, f'printf "{octal(forged)}" > {relay_out}', 30).exit_code == 0
            # The one thing a frame can ask for: a connection to the proxy's socket, where the agent's session token
            # is still the credential.
            wait_until(lambda: dialled == [b"forged"], 30, "the forged connection never reached the proxy's socket")
            huge = FRAME.pack(b"D", 2, 0xFFFFFFFF)  # 4 GiB announced
            assert pod_backend.exec(sandbox, f'printf "{octal(huge)}" > {relay_out}', 30).exit_code == 0
            wait_until(lambda: tunnel.error is not None, 30, "the tunnel read on past a forged frame")
        assert "not a relay frame" in str(tunnel.error)
        assert dialled == [b"forged"]  # nothing else was dialled
    finally:
        pod_backend.destroy(sandbox)
        proxy.close()
