"""JetStream as the services use it: a context that rides out a configuration reload (:func:`jetstream`), and KV
buckets opened (or made, once, even when several instances race) with their keys listed without the consumer leak of
nats-py's ``KeyValue.keys()``.

``keys()`` makes an ordered consumer on every call and never removes it (a busy reaper reaches the server's
consumer limit within a minute), and its key filters return nothing. :func:`bucket_keys` reads the KV stream's
per-subject counts instead (``stream_info`` with a subject filter), which makes no consumer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext, JetStreamManager, api
from nats.js.kv import KeyValue

#: How long a request is asked again while JetStream answers 503 (a configuration reload takes milliseconds).
RELOAD_GRACE_S = 5.0
T = TypeVar("T")


async def through_reload(ask: Callable[[], Awaitable[T]]) -> T:
    """``ask()``, asked again while JetStream answers 503 ("no responders"), for up to ``RELOAD_GRACE_S``: it does so
    for a moment while nats-server reloads its configuration (the embedded stack reloads it when a team is added and
    for each run login issued or revoked: ``runctl.runlogins``)."""
    deadline = time.monotonic() + RELOAD_GRACE_S
    while True:
        try:
            return await ask()
        except (nats.js.errors.ServiceUnavailableError, nats.js.errors.NoStreamResponseError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


class _ThroughReload:
    """Every JetStream API request asked again through a reload's 503 answers. A 503 is nats-server's "no responders":
    no one took the request, so asking again cannot do anything twice."""

    async def _api_request(self, req_subject: str, req: bytes = b"", timeout: float = 5) -> dict[str, Any]:
        ask = super()._api_request  # type: ignore[misc]
        return await through_reload(lambda: ask(req_subject, req, timeout=timeout))


class _Manager(_ThroughReload, JetStreamManager):
    pass


class ReloadTolerantJetStream(_ThroughReload, JetStreamContext):
    """nats-py's JetStream context whose API requests — its own and those of the managers it makes for subscriptions
    and ordered consumers' resets — and whose publishes (a key-value put among them) ride out a configuration reload
    (:func:`through_reload`). A publish asked again is one no stream took."""

    @property
    def _jsm(self) -> JetStreamManager:
        return _Manager(conn=self._nc, prefix=self._prefix, timeout=self._timeout)

    async def publish(self, subject: str, payload: bytes = b"", *args: Any, **kwargs: Any) -> api.PubAck:
        publish = super().publish
        return await through_reload(lambda: publish(subject, payload, *args, **kwargs))


def jetstream(nc: NATS, prefix: str | None = None) -> JetStreamContext:
    """The JetStream context the services use (:class:`ReloadTolerantJetStream`), of ``prefix``'s API if given."""
    return ReloadTolerantJetStream(nc) if prefix is None else ReloadTolerantJetStream(nc, prefix=prefix)


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
    """Keys in ``bucket`` (those under ``prefix.`` when given). Deleted keys may be listed: a ``get`` skips them."""
    pattern = f"$KV.{bucket}.{prefix}.>" if prefix else f"$KV.{bucket}.>"
    info = await js.stream_info(f"KV_{bucket}", subjects_filter=pattern)
    return [subject.removeprefix(f"$KV.{bucket}.") for subject in info.state.subjects or {}]
