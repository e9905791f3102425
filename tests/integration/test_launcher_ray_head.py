"""The Ray head the launcher starts for its runners takes jobs while another Ray on the machine holds Ray's fixed
default ports (a foreground `runctl run`'s own cluster, another stack's head): its dashboard agent, which the Jobs API
hands every job to, listens on a port of its own, not on 52365."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.launcher.carry.rayjob import TERMINAL, RayJobs
from tests.infra import ray_head as ray_infra

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(ray_infra.why_unavailable()), reason=str(ray_infra.why_unavailable())),
]

#: Ray's listeners with a fixed default port: the dashboard agent's HTTP server and the client server.
RAY_FIXED_PORTS = (52365, 10001)


@pytest.fixture
def ports_taken() -> Iterator[None]:
    """Ray's fixed default ports held, as another Ray on the machine holds them (one held already counts too)."""
    held = []
    for port in RAY_FIXED_PORTS:
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            held.append(sock)
        except OSError:  # another process of the suite holds it: as good
            sock.close()
    try:
        yield
    finally:
        for sock in held:
            sock.close()


@pytest.mark.timeout(300)
def test_the_launchers_head_takes_a_job_while_rays_default_ports_are_taken(
    ports_taken: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNCTL_HOME", str(tmp_path))
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RUNCTL_RAY_JOBS_URL"):
        monkeypatch.delenv(name, raising=False)
    jobs = RayJobs()
    try:
        # Starts the head, waits for its jobs server, then for its dashboard agent.
        submission = jobs.submit_entrypoint("true", "agent-port")
        deadline = time.monotonic() + 120
        while (status := jobs.status(submission)) not in TERMINAL and time.monotonic() < deadline:
            time.sleep(0.5)
        assert status == "SUCCEEDED", (status, jobs.log_tail(submission))
    finally:
        jobs.close()
