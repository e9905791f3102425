"""JetStream KV buckets as the services use them: opened (or made, once, even when several instances race), and
their keys listed without the consumer leak of nats-py's ``KeyValue.keys()``.

``keys()`` makes an ordered consumer on every call and never removes it (a busy reaper reaches the server's
consumer limit within a minute), and its key filters return nothing. :func:`bucket_keys` reads the KV stream's
per-subject counts instead (``stream_info`` with a subject filter), which makes no consumer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

#: How long a request is asked again while JetStream answers 503 (a configuration reload takes milliseconds).
RELOAD_GRACE_S = 5.0
T = TypeVar("T")


async def through_reload(ask: Callable[[], Awaitable[T]]) -> T:
    """``ask()``, asked again while JetStream answers 503, for up to ``RELOAD_GRACE_S``: its API does so for a moment
    while nats-server reloads its configuration (the embedded stack reloads it when a team is added and for each run
    login issued or revoked: ``runctl.runlogins``)."""
    deadline = time.monotonic() + RELOAD_GRACE_S
    while True:
        try:
            return await ask()
        except nats.js.errors.ServiceUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def open_bucket(js: JetStreamContext, bucket: str) -> KeyValue:
    """The bucket, made (history 1) if it does not exist yet; through a reload's 503 answers."""
    return await through_reload(lambda: _open_bucket(js, bucket))


async def _open_bucket(js: JetStreamContext, bucket: str) -> KeyValue:
    try:
        return await js.key_value(bucket)
    except nats.js.errors.BucketNotFoundError:
        try:
            return await js.create_key_value(bucket=bucket, history=1)
        except nats.js.errors.BadRequestError:  # another instance made it first
            return await js.key_value(bucket)


async def bucket_keys(js: JetStreamContext, bucket: str, prefix: str = "") -> list[str]:
    """Keys in ``bucket`` (those under ``prefix.`` when given), through a reload's 503 answers. Deleted keys may be
    listed: a ``get`` skips them."""
    pattern = f"$KV.{bucket}.{prefix}.>" if prefix else f"$KV.{bucket}.>"
    info = await through_reload(lambda: js.stream_info(f"KV_{bucket}", subjects_filter=pattern))
    return [subject.removeprefix(f"$KV.{bucket}.") for subject in info.state.subjects or {}]
