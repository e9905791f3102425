"""Two teams and the services on a real nats-server configured by ``runctl.natsauth``: every cross-team operation on
the bus is refused by the server (and counted), and a team reads its own events."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from nats.js import api

from runctl.bus.client import stream_configs
from runctl.events import RunQueued
from runctl.natsauth import ADMIN_USER, SERVICES_USER, NatsUser, inbox_prefix, nats_hash, server_config
from runctl.stack import nats_server_binary
from runctl.subjects import event_subject
from tests.conftest import free_port, wait_until
from tests.infra.bus_attacks import attack, until

pytestmark = pytest.mark.integration
PASSWORDS = {SERVICES_USER: "services-secret", ADMIN_USER: "admin-secret", "nlp": "nlp-secret", "vision": "v-secret"}
QUEUED = event_subject("vision", "v-run", RunQueued.event_name)


def hashed(name: str) -> NatsUser:
    return NatsUser(name, nats_hash(PASSWORDS[name]))


@dataclass
class Server:
    port: int

    def url(self, user: str) -> str:
        return f"nats://{user}:{PASSWORDS[user]}@127.0.0.1:{self.port}"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    port = free_port()
    conf = tmp_path / "nats.conf"
    teams = [hashed("nlp"), hashed("vision")]
    conf.write_text(
        server_config(f"127.0.0.1:{port}", str(tmp_path / "js"), hashed(SERVICES_USER), hashed(ADMIN_USER), teams)
    )
    with (tmp_path / "nats.log").open("wb") as log:
        proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    try:

        def listening() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        wait_until(listening, 10, "nats-server")
        yield Server(port)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
async def services(server: Server) -> AsyncIterator[nats.NATS]:
    nc = await nats.connect(server.url(SERVICES_USER))
    js = nc.jetstream()
    for config in stream_configs():
        await js.add_stream(config)
    await js.add_consumer("RUNS", api.ConsumerConfig(durable_name="launcher", ack_policy=api.AckPolicy.EXPLICIT))
    await js.publish(QUEUED, b'{"secret": "vision"}')
    await js.publish(event_subject("nlp", "n-run", RunQueued.event_name), b'{"mine": "nlp"}')
    yield nc
    await nc.close()


async def test_a_team_cannot_see_touch_or_stop_another_teams_work_on_the_bus(
    server: Server, services: nats.NATS
) -> None:
    done = await attack(f"nats://127.0.0.1:{server.port}", "nlp", PASSWORDS["nlp"], "vision")
    print(f"refused {len(done.refused)} of {len(done.attempts)} cross-team operations")
    assert done.not_refused() == [] and len(done.attempts) == 21
    assert done.received == []

    # What a team may do: read its own events through a named consumer filtered to its subjects.
    nlp = await nats.connect(server.url("nlp"), inbox_prefix=inbox_prefix("nlp"))
    received: list[bytes] = []

    async def keep(msg: nats.aio.msg.Msg) -> None:
        received.append(msg.data)

    own = await nlp.jetstream().subscribe(
        "runctl.nlp.>",
        stream="RUNS",
        config=api.ConsumerConfig(name="nlp-watch", ack_policy=api.AckPolicy.NONE, inactive_threshold=30),
        cb=keep,
    )
    await asyncio.wait_for(until(lambda: received == [b'{"mine": "nlp"}']), 10)
    await own.unsubscribe()
    await nlp.close()
    # The services' durable consumer is untouched: it still has both events to deliver.
    info = await services.jetstream().consumer_info("RUNS", "launcher")
    assert info.num_pending == 2
