"""KV buckets: made once under a race, keys listed without leaving consumers behind; the services' JetStream context
through a reload."""

from __future__ import annotations

import asyncio
import json

import nats
import nats.js.errors
import pytest
from nats.aio.msg import Msg

from runctl.bus import Bus
from runctl.bus.kv import bucket_keys, jetstream, open_bucket
from tests.conftest import NatsServer

pytestmark = pytest.mark.integration


async def test_racing_opens_share_one_bucket_and_listing_makes_no_consumer(bus: Bus) -> None:
    buckets = await asyncio.gather(*(open_bucket(bus.js, "runctl_kvtest") for _ in range(4)))
    await buckets[0].put("sb.a", b"1")
    await buckets[1].put("sb.b", b"2")
    await buckets[2].put("owner.x", b"3")
    for _ in range(20):
        assert sorted(await bucket_keys(bus.js, "runctl_kvtest", "sb")) == ["sb.a", "sb.b"]
    assert sorted(await bucket_keys(bus.js, "runctl_kvtest")) == ["owner.x", "sb.a", "sb.b"]
    info = await bus.js.stream_info("KV_runctl_kvtest")
    assert info.state.consumer_count == 0


async def test_the_services_jetstream_asks_again_while_no_one_answers_as_in_a_reload(nats_server: NatsServer) -> None:
    """nats-server answers 503 ("no responders") for a moment while it reloads its configuration. The services' context
    asks again — its own API requests, its managers' (subscriptions make consumers through those) and publishes — and
    gets the answer that comes once someone responds; nats-py's own context fails at once."""
    nc = await nats.connect(nats_server.url)
    try:
        prefix = "$LATE.API"  # answered by this test, and only after a while
        js = jetstream(nc, prefix=prefix)
        with pytest.raises(nats.js.errors.ServiceUnavailableError):
            await nc.jetstream(prefix=prefix).account_info()
        with pytest.raises(nats.js.errors.NoStreamResponseError):
            await nc.jetstream().publish("late.event", b"x")

        async def answer(msg: Msg) -> None:
            if msg.subject == "late.event":
                await msg.respond(json.dumps({"stream": "LATE", "seq": 7}).encode())
            else:
                await msg.respond(json.dumps({"memory": 0, "storage": 0, "streams": 0, "consumers": 0}).encode())

        async def respond_later() -> None:
            await asyncio.sleep(0.5)
            await nc.subscribe(f"{prefix}.>", cb=answer)
            await nc.subscribe("late.event", cb=answer)

        late = asyncio.create_task(respond_later())
        ack, _, _ = await asyncio.gather(js.publish("late.event", b"x"), js.account_info(), js._jsm.account_info())
        await late
        assert (ack.stream, ack.seq) == ("LATE", 7)
    finally:
        await nc.close()
