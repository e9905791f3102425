"""The stack's health probe (``runctl up`` waits on it, ``runctl status`` prints it) against a real nats-server."""

from __future__ import annotations

import socket
import subprocess

from runctl.stack import SERVICES, probe
from tests.conftest import _stop, free_port, nats_server_binary, wait_until


async def test_a_bus_whose_jetstream_does_not_answer_is_reported_not_ready_not_raised() -> None:
    # A bus up without JetStream answering (as one still starting, or starved on a loaded machine, is): `runctl up`
    # must keep waiting until its own deadline, not end with the client's TimeoutError (seen in CI).
    port = free_port()
    proc = subprocess.Popen(
        [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:

        def listening() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        wait_until(listening, 10, "nats-server")
        health = await probe(f"nats://127.0.0.1:{port}", timeout_s=0.5)
    finally:
        _stop(proc)
    assert health["nats-server"]["ok"] is False and "JetStream does not answer" in health["nats-server"]["detail"]
    assert all(health[name] == {"pid": None, "restarts": 0, "ok": False, "detail": health[name]["detail"]}
               for name in SERVICES)  # fmt: skip
    assert all("no health reply" in health[name]["detail"] for name in SERVICES)
