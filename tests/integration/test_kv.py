"""KV buckets: made once under a race, keys listed without leaving consumers behind."""

from __future__ import annotations

import asyncio

import pytest

from runctl.bus import Bus
from runctl.bus.kv import bucket_keys, open_bucket

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
