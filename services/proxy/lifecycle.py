"""A model call's one life, whatever API it came in on: parse it (the :class:`~services.proxy.surface.Surface`),
resolve the model name, send it to a replica with token ids and logprobs asked for, answer whole or relay the
stream, capture the turn into the session's trajectory, count it, and map every failure to the surface's error."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from services.proxy import anthropic_surface as anth
from services.proxy.errors import ProxyError, UpstreamError
from services.proxy.http11 import ClientGone, Request, Responder, UpstreamResponse
from services.proxy.names import ModelNames
from services.proxy.openai_surface import SSEReader
from services.proxy.replicas import Replica
from services.proxy.stats import ProxyMetrics
from services.proxy.surface import Groups, Relay, Surface
from services.proxy.trajectory import Session, Turn
from services.proxy.upstream import Upstream

CLIENT_GONE = 499  # the status nginx logs for "client closed the request"
PAUSED = (
    "the replica paused for a weight update and cut this streamed answer short; it is not recorded. "
    "Fix: send the request again (or without streaming, which the proxy resends itself)"
)


def over_budget(session: Session) -> str:
    """What a call past the session's turns is told (the agent shows it as its error)."""
    return (
        f"this trial's turns are spent: the model answered {session.max_turns}, all that the run allows each trial "
        "(AGENT_MAX_ITERATIONS); the proxy answers no more of this session's turns. Fix: raise AGENT_MAX_ITERATIONS "
        "to give each trial more turns"
    )


def _body(req: Request) -> dict[str, Any]:
    try:
        body = orjson.loads(req.body)
    except orjson.JSONDecodeError as e:
        raise ProxyError(400, f"the request body is not JSON: {e}") from e
    if not isinstance(body, dict):
        raise ProxyError(400, "the request body must be a JSON object")
    return body


class Lifecycle:
    def __init__(self, upstream: Upstream, models: ModelNames, metrics: ProxyMetrics) -> None:
        self.upstream = upstream
        self.models = models
        self.metrics = metrics

    async def serve(self, surface: Surface, session: Session, req: Request, resp: Responder) -> None:
        started, t0 = time.time(), time.perf_counter()
        code = 200
        admitted = recorded = False
        session.idle.enter()
        resp.cancel_when_gone()
        try:
            body = _body(req)
            call = surface.call(body, self.models, self.upstream.learned_model())
            side = self.models.is_side(body.get("model"))  # a side model's call is not one of the policy's turns
            if not side:
                if not session.admit_turn():
                    code = 400
                    resp.send(code, surface.error(code, over_budget(session), "invalid_request_error"))
                    return
                admitted = True
            payload = orjson.dumps(call.upstream)
            if not body.get("stream"):
                replica, code, data, obj = await self.upstream.whole(session, surface.path, payload)
                if obj is None:
                    resp.send(code, surface.upstream_failed(code, data))
                    session.errors += 1
                    return
                answer, groups = call.answer(obj)
                resp.send(200, answer)
                self._record(session, surface.name, body, side, groups, replica, started, None, obj.get("usage"))
                recorded = True
                return
            replica, upstream = await self.upstream.send(session, surface.path, payload)
            try:
                code = upstream.status
                if code != 200:
                    resp.send(code, surface.upstream_failed(code, await upstream.read()))
                    session.errors += 1
                    return
                relay = call.relay()
                await self._relay(upstream, relay, resp)
                capture = relay.capture
                groups = relay.groups()
                self._record(
                    session, surface.name, body, side, groups, replica, started, capture.first_token_at, capture.usage
                )
                recorded = True
            finally:
                replica.in_flight -= 1
        except ProxyError as e:
            code = e.status
            session.errors += 1
            if not resp.started:
                resp.send(e.status, surface.error(e.status, e.message, e.kind))
        except (asyncio.CancelledError, ClientGone):
            code = CLIENT_GONE
            raise
        finally:
            if admitted and not recorded:  # a call that failed is not one of the session's turns
                session.give_back_turn()
            session.idle.leave()
            self.metrics.requests.inc(surface.name, str(code))
            self.metrics.latency.observe(time.perf_counter() - t0, surface.name)

    async def _relay(self, upstream: UpstreamResponse, relay: Relay, resp: Responder) -> None:
        """The upstream's stream to the client, event by event, each chunk captured on its way."""
        resp.start_stream(200)
        reader = SSEReader()
        try:
            async for data in upstream.chunks():
                out: list[bytes] = []
                for payload in reader.feed(data):
                    if payload == b"[DONE]":
                        out.append(relay.done())
                        continue
                    try:
                        obj = orjson.loads(payload)
                    except orjson.JSONDecodeError:
                        out.append(relay.unparsed(payload))
                        continue
                    if "error" in obj and "choices" not in obj:
                        out.append(relay.upstream_error(obj, payload))
                        continue
                    if self.upstream.stream_cut_short(obj):
                        await resp.write(b"".join(out) + relay.error(503, PAUSED, "service_unavailable"))
                        resp.end()
                        raise ProxyError(503, PAUSED, "service_unavailable")
                    relay.capture.feed(obj)
                    out.append(relay.chunk(obj, payload))
                if any(out):
                    await resp.write(b"".join(out))
        except UpstreamError as e:
            await resp.write(relay.error(502, f"the replica failed mid-stream: {e}", "upstream_error"))
            raise ProxyError(502, str(e), "upstream_error") from e
        finally:
            upstream.close() if resp.client_gone else None
        ending = relay.finish()
        if ending:
            await resp.write(ending)
        resp.end()

    def _record(
        self,
        session: Session,
        surface: str,
        request: dict[str, Any],
        side: bool,
        groups: Groups,
        replica: Replica,
        started: float,
        first_token_at: float | None,
        usage: dict[str, Any] | None,
    ) -> None:
        now = time.time()
        replica.answered()
        to_first = None if first_token_at is None else first_token_at - started
        for prompt_ids, choices in groups:
            session.add_turn(
                Turn(surface, request, prompt_ids, choices, replica.name, started, to_first, now - started, usage,
                     side=side)
            )  # fmt: skip
        if usage:
            self.metrics.tokens.inc("prompt", by=usage.get("prompt_tokens", 0) or 0)
            self.metrics.tokens.inc("completion", by=usage.get("completion_tokens", 0) or 0)

    async def count_tokens(self, session: Session, req: Request, resp: Responder) -> None:
        """Anthropic's ``/v1/messages/count_tokens``, asked of the replica's tokenizer."""
        try:
            body = _body(req)
            chat = anth.to_openai(body)
            served = self.models.resolve(body.get("model"), self.upstream.learned_model())
            query: dict[str, Any] = {"model": served, "messages": chat["messages"], "add_generation_prompt": True}
            if chat.get("tools"):
                query["tools"] = chat["tools"]
            replica, upstream = await self.upstream.send(session, "/tokenize", orjson.dumps(query))
            try:
                data = await upstream.read()
            finally:
                replica.in_flight -= 1
            if upstream.status != 200:
                resp.send(upstream.status, anth.error_body(upstream.status, anth.upstream_error_message(data)))
                return
            resp.send(200, orjson.dumps({"input_tokens": orjson.loads(data).get("count", 0)}))
        except ProxyError as e:
            resp.send(e.status, anth.error_body(e.status, e.message))
