"""Sending a request to a replica: the session's own (or the least busy), another when one cannot be reached, and
an answer a paused replica cut short asked for again."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from services.proxy.errors import NoReplica, ProxyError, UpstreamError, UpstreamTimeout
from services.proxy.http11 import UpstreamResponse
from services.proxy.replicas import Replica, ReplicaPool
from services.proxy.stats import ProxyMetrics
from services.proxy.trajectory import Session

log = logging.getLogger(__name__)

ABORTED = "abort"  # vLLM's finish reason for a request its engine dropped (a pause for a weight update)
MAX_RESENDS = 8


def cut_short(obj: dict[str, Any]) -> bool:
    """Whether a response (or stream chunk) ends a choice that the replica cut short."""
    return any(isinstance(c, dict) and c.get("finish_reason") == ABORTED for c in obj.get("choices") or ())


class Upstream:
    """The replicas, as a request's lifecycle reaches them.

    ``resend_aborted``: a replica paused for a weight update (verl's fully async trainer) ends the requests it was
    generating with finish reason "abort". With this on, such an answer is never handed to the agent or recorded:
    the request is sent again whole (the engine holds it until it resumes, on the new weights), so every token of a
    turn comes from one policy version. A stream already under way cannot be taken back: it ends with an error
    event, and its turn is not recorded.
    """

    def __init__(
        self, pool: ReplicaPool, metrics: ProxyMetrics, request_timeout_s: float, resend_aborted: bool
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.request_timeout_s = request_timeout_s
        self.resend_aborted = resend_aborted

    def learned_model(self) -> str | None:
        """The model name a replica said it serves (``/v1/models``), if any has."""
        for replica in self.pool.replicas.values():
            if replica.served_model:
                return replica.served_model
        return None

    async def send(self, session: Session, path: str, body: bytes) -> tuple[Replica, UpstreamResponse]:
        """Send to the session's replica (or the least busy one); a replica that cannot be reached is taken out and
        the request goes to the next. The caller decrements the returned replica's ``in_flight``."""
        tried: set[str] = set()
        while True:
            try:
                replica = self.pool.pick(session.replica, tried)
            except NoReplica as e:
                raise ProxyError(503, str(e), "service_unavailable") from e
            replica.in_flight += 1
            try:
                upstream = await replica.client.request("POST", path, body, timeout_s=self.request_timeout_s)
            except UpstreamTimeout as e:
                replica.in_flight -= 1
                raise ProxyError(
                    504, f"replica {replica.name} did not answer within {self.request_timeout_s:g}s", "timeout"
                ) from e
            except UpstreamError as e:
                replica.in_flight -= 1
                if e.answered:
                    raise ProxyError(502, f"replica {replica.name} failed mid-answer: {e}", "upstream_error") from e
                self.pool.mark_down(replica, str(e))
                tried.add(replica.name)
                self.metrics.failovers.inc()
                continue
            except BaseException:
                replica.in_flight -= 1
                raise
            replica.requests += 1
            replica.answered()
            session.replica = replica.name
            return replica, upstream

    async def whole(self, session: Session, path: str, payload: bytes) -> tuple[Replica, int, bytes, Any]:
        """A non-streamed answer: the replica, the status, the body, and the body parsed when the status is 200
        (else None). An answer a paused replica cut short is asked for again when ``resend_aborted`` is on."""
        for _ in range(MAX_RESENDS + 1):
            replica, upstream = await self.send(session, path, payload)
            try:
                data = await upstream.read()
            finally:
                replica.in_flight -= 1
            if upstream.status != 200:
                return replica, upstream.status, data, None
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError as e:
                raise ProxyError(502, f"replica {replica.name} answered with a body that is not JSON: {e}") from e
            if not (self.resend_aborted and cut_short(obj)):
                return replica, 200, data, obj
            self.metrics.resent.inc("resent")
            log.info("replica %s cut a request short (paused for a weight update); sending it again", replica.name)
        raise ProxyError(
            503,
            f"the replicas cut this request short {MAX_RESENDS + 1} times in a row (finish reason abort: paused for "
            "weight updates). Fix: send it again",
            "service_unavailable",
        )

    def stream_cut_short(self, obj: dict[str, Any]) -> bool:
        """True (and counted) when a stream chunk ends a choice the replica cut short, which is not handed on."""
        if self.resend_aborted and cut_short(obj):
            self.metrics.resent.inc("stream_ended")
            return True
        return False
