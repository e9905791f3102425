"""Two teams and the services on a real nats-server configured by ``runctl.natsauth``: every cross-team operation on
the bus is refused by the server (and counted), and a team reads its own events."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import nats
import pytest
from nats.js import api

from runctl.bus.client import stream_configs
from runctl.events import RunQueued
from runctl.natsauth import ADMIN_USER, SERVICES_USER, NatsUser, inbox_prefix, server_config
from runctl.stack import nats_server_binary
from runctl.subjects import event_subject
from tests.conftest import free_port, wait_until

pytestmark = pytest.mark.integration
PASSWORDS = {SERVICES_USER: "services-secret", ADMIN_USER: "admin-secret", "nlp": "nlp-secret", "vision": "v-secret"}
QUEUED = event_subject("vision", "v-run", RunQueued.event_name)


def hashed(name: str) -> NatsUser:
    return NatsUser(name, bcrypt.hashpw(PASSWORDS[name].encode(), bcrypt.gensalt(rounds=4)).decode())


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
    violations: list[str] = []

    async def on_error(e: Exception) -> None:
        violations.append(str(e))

    nlp = await nats.connect(server.url("nlp"), inbox_prefix=inbox_prefix("nlp"), error_cb=on_error)
    try:
        await _cross_team(nlp, services, violations)
    finally:
        await nlp.close()


async def _cross_team(nlp: nats.NATS, services: nats.NATS, violations: list[str]) -> None:
    js = nlp.jetstream(timeout=1.0)
    refused: list[str] = []
    attempts: list[str] = []

    async def refuses(what: str, attempt: Callable[[], Awaitable[object]]) -> None:
        """Counted as refused when the server answers the attempt with a permissions violation (which reaches the
        client on its own, after the request has timed out or the publish gone)."""
        attempts.append(what)
        before = len(violations)
        try:
            await attempt()
            await nlp.flush(timeout=2)
        except Exception:  # the request the server dropped times out; the violation says why
            pass
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_until(lambda: len(violations) > before), 5)
        if len(violations) == before + 1 and "permissions violation" in violations[-1].lower():
            refused.append(f"{what}: {violations[-1]}")

    received: list[bytes] = []

    async def keep(msg: nats.aio.msg.Msg) -> None:
        received.append(msg.data)

    await refuses("publish as vision", lambda: js.publish(QUEUED, b"forged"))
    await refuses("subscribe to vision's subjects", lambda: nlp.subscribe("runctl.vision.>", cb=keep))
    await refuses("subscribe to every team's subjects", lambda: nlp.subscribe("runctl.>", cb=keep))
    await refuses("subscribe to another inbox", lambda: nlp.subscribe("_INBOX_vision.>", cb=keep))
    await refuses(
        "consumer filtered on vision's subjects",
        lambda: js.add_consumer("RUNS", api.ConsumerConfig(name="peek", filter_subject="runctl.vision.>")),
    )
    await refuses(
        "consumer filtered on every team",
        lambda: js.add_consumer("RUNS", api.ConsumerConfig(name="all", filter_subject="runctl.>")),
    )
    await refuses("consumer without a filter", lambda: js.add_consumer("TRIALS", api.ConsumerConfig()))
    await refuses("durable consumer (legacy create)", lambda: js.add_consumer("RUNS", durable_name="mine"))
    await refuses("stream get by sequence", lambda: js.get_msg("RUNS", 1))
    await refuses("stream get of vision's last", lambda: js.get_last_msg("RUNS", QUEUED))
    await refuses("direct get of vision's last", lambda: js.get_last_msg("RUNS", QUEUED, direct=True))
    await refuses(
        "pull from the launcher's consumer",
        lambda: nlp.request("$JS.API.CONSUMER.MSG.NEXT.RUNS.launcher", b"1", timeout=1),
    )
    await refuses("ack on the launcher's consumer", lambda: nlp.publish("$JS.ACK.RUNS.launcher.1.1.1.0.0", b"+ACK"))
    await refuses("launcher consumer info", lambda: js.consumer_info("RUNS", "launcher"))
    await refuses("delete the launcher's consumer", lambda: js.delete_consumer("RUNS", "launcher"))
    await refuses("purge a stream", lambda: js.purge_stream("RUNS"))
    await refuses("delete a stream", lambda: js.delete_stream("TRIALS"))
    await refuses("update a stream", lambda: js.update_stream(api.StreamConfig(name="RUNS", subjects=["x.>"])))
    await refuses(
        "create a stream", lambda: js.add_stream(api.StreamConfig(name="MINE", subjects=["runctl.nlp.mine.>"]))
    )
    await refuses("a services subject", lambda: nlp.request("_runctl.health.launcher", b"", timeout=1))
    print(f"refused {len(refused)} of {len(attempts)} cross-team operations")
    assert [a for a in attempts if not any(r.startswith(a + ":") for r in refused)] == []
    assert received == []

    # What a team may do: read its own events through a named consumer filtered to its subjects.
    own = await js.subscribe(
        "runctl.nlp.>",
        stream="RUNS",
        config=api.ConsumerConfig(name="nlp-watch", ack_policy=api.AckPolicy.NONE, inactive_threshold=30),
        cb=keep,
    )
    await asyncio.wait_for(_until(lambda: received == [b'{"mine": "nlp"}']), 10)
    await own.unsubscribe()
    # The services' durable consumer is untouched: it still has both events to deliver.
    info = await services.jetstream().consumer_info("RUNS", "launcher")
    assert info.num_pending == 2


async def _until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        await asyncio.sleep(0.05)
