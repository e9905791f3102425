"""JetStream KV buckets as the services use them: opened (or made, once, even when several instances race), and
their keys listed without the consumer leak of nats-py's ``KeyValue.keys()``.

``keys()`` makes an ordered consumer on every call and never removes it (a busy reaper reaches the server's
consumer limit within a minute), and its key filters return nothing. :func:`bucket_keys` reads the KV stream's
per-subject counts instead (``stream_info`` with a subject filter), which makes no consumer.
"""

from __future__ import annotations

import asyncio
import time

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

#: How long a listing is asked again while JetStream answers 503 (a configuration reload takes milliseconds).
RELOAD_GRACE_S = 5.0


async def open_bucket(js: JetStreamContext, bucket: str) -> KeyValue:
    """The bucket, made (history 1) if it does not exist yet."""
    try:
        return await js.key_value(bucket)
    except nats.js.errors.BucketNotFoundError:
        try:
            return await js.create_key_value(bucket=bucket, history=1)
        except nats.js.errors.BadRequestError:  # another instance made it first
            return await js.key_value(bucket)


async def bucket_keys(js: JetStreamContext, bucket: str, prefix: str = "") -> list[str]:
    """Keys in ``bucket`` (those under ``prefix.`` when given). Deleted keys may be listed: a ``get`` skips them.

    JetStream's API answers 503 for a moment while nats-server reloads its configuration (the embedded stack reloads
    it for each run login issued or revoked: ``runctl.runlogins``); such an answer is asked again, for up to
    ``RELOAD_GRACE_S``."""
    pattern = f"$KV.{bucket}.{prefix}.>" if prefix else f"$KV.{bucket}.>"
    deadline = time.monotonic() + RELOAD_GRACE_S
    while True:
        try:
            info = await js.stream_info(f"KV_{bucket}", subjects_filter=pattern)
            break
        except nats.js.errors.ServiceUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
    return [subject.removeprefix(f"$KV.{bucket}.") for subject in info.state.subjects or {}]
