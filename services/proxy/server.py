"""The proxy server: per-session OpenAI and Anthropic endpoints before vLLM replicas, with trajectory capture.

In process (the agent loop)::

    async with ProxyServer(["http://127.0.0.1:8000"], trajectory_dir=trial_dir) as proxy:
        session = proxy.open_session({"trial": "t-1"})
        ...  # give the agent session.openai_base_url or session.anthropic_base_url
        trajectory = await proxy.close_session(session.id)

Over HTTP, the admin API (``Authorization: Bearer <admin token>``) does the same: ``POST /sessions``,
``GET /sessions/{id}/trajectory``, ``DELETE /sessions/{id}``; plus ``GET /sessions``, ``GET /replicas``.
Unauthenticated: ``GET /health`` and ``GET /metrics``. A session's endpoints live under ``/sess/<token>/``; an
unknown or closed token gets the same 404 as any unknown path.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from runctl.metrics import Counter, Gauge, Histogram, Registry
from services.proxy import anthropic_surface as anth
from services.proxy.errors import (
    NoReplica,
    ProxyError,
    ProxyStartError,
    TranslationError,
    UpstreamError,
    UpstreamTimeout,
)
from services.proxy.http11 import (
    ClientGone,
    HttpServer,
    Request,
    Responder,
    UpstreamResponse,
)
from services.proxy.openai_surface import (
    CHAT,
    COMPLETIONS,
    SSEReader,
    StreamCapture,
    Wants,
    read_response,
    upstream_body,
)
from services.proxy.replicas import ASLEEP, UP, RayDiscovery, Replica, ReplicaPool, parse_upstream
from services.proxy.trajectory import Choice, Session, Turn, write_trajectory

log = logging.getLogger(__name__)

ANTHROPIC = "anthropic.messages"
PROVIDER_PREFIXES = ("openai/", "hosted_vllm/", "vllm/", "anthropic/", "litellm_proxy/")
DEFAULT_ALIASES = ("claude-*",)  # Claude Code asks for Claude model names; they mean the policy here
NOT_FOUND = b'{"error": {"message": "Not Found", "type": "not_found_error", "code": 404}}'
CLOSED_KEPT = 1024
CLIENT_GONE = 499  # the status nginx logs for "client closed the request"
ABORTED = "abort"  # vLLM's finish reason for a request its engine dropped (a pause for a weight update)
MAX_RESENDS = 8
PAUSED = (
    "the replica paused for a weight update and cut this streamed answer short; it is not recorded. "
    "Fix: send the request again (or without streaming, which the proxy resends itself)"
)
_EVERYTHING = Wants(logprobs=True, token_ids=True)


def openai_error(status: int, message: str, kind: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "code": status}})


def _cut_short(obj: dict[str, Any]) -> bool:
    return any(isinstance(c, dict) and c.get("finish_reason") == ABORTED for c in obj.get("choices") or ())


class ModelNames:
    """Which model names a client may ask for: the served name, it with a provider prefix (``openai/NAME``,
    ``hosted_vllm/NAME`` ...), and aliases (exact names or ``fnmatch`` patterns; ``claude-*`` by default)."""

    def __init__(self, served: str | None, aliases: tuple[str, ...] = DEFAULT_ALIASES) -> None:
        self.served = served
        self.aliases = aliases

    def resolve(self, asked: Any, learned: str | None) -> str:
        served = self.served or learned
        if served is None:
            raise ProxyError(
                503, "the served model name is not known yet: no replica has answered /v1/models", "service_unavailable"
            )
        if asked is None or asked == served:
            return served
        name = str(asked)
        for prefix in PROVIDER_PREFIXES:
            if name.startswith(prefix) and name[len(prefix) :] == served:
                return served
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in self.aliases):
            return served
        accepted = ", ".join([served, *self.aliases])
        raise ProxyError(
            404,
            f"model {name!r} is not served here. Fix: ask for {served!r} (accepted: {accepted}).",
            "model_not_found",
        )


@dataclass(frozen=True)
class SessionInfo:
    id: str
    openai_base_url: str
    anthropic_base_url: str

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "openai_base_url": self.openai_base_url, "anthropic_base_url": self.anthropic_base_url}


class ProxyServer:
    """See the module docstring. ``port=0`` takes an ephemeral port; ``advertise_host`` is the host put in session
    URLs (default: the bind host), for agents that reach the proxy by another name."""

    def __init__(
        self,
        upstreams: list[str] | tuple[str, ...] = (),
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise_host: str | None = None,
        trajectory_dir: Path | str | None = None,
        admin_token: str | None = None,
        served_model: str | None = None,
        aliases: tuple[str, ...] = DEFAULT_ALIASES,
        ray_address: str | None = None,
        discover_ray: bool = False,
        health_interval_s: float = 5.0,
        probe_timeout_s: float = 30.0,
        request_timeout_s: float = 1800.0,
        close_wait_s: float = 60.0,
        unix_socket: str | Path | None = None,
        resend_aborted: bool = False,
    ) -> None:
        self.pool = ReplicaPool(interval_s=health_interval_s, probe_timeout_s=probe_timeout_s)
        for url in upstreams:
            self.pool.add(url)
        self.discovery = RayDiscovery(self.pool, ray_address, health_interval_s) if discover_ray else None
        # Also on a Unix socket when asked: a sandbox without a network reaches the proxy through it, bound in.
        self.http = HttpServer(self.handle, host, port, str(unix_socket) if unix_socket else None)
        self.advertise_host = advertise_host
        self.trajectory_dir = Path(trajectory_dir) if trajectory_dir else None
        self.admin_token = admin_token or secrets.token_urlsafe(32)
        self.models = ModelNames(served_model, aliases)
        self.request_timeout_s = request_timeout_s
        self.close_wait_s = close_wait_s
        # A replica paused for a weight update (verl's fully async trainer) ends the requests it was generating with
        # finish reason "abort". With this on, such an answer is never handed to the agent or recorded: the request
        # is sent again whole (the engine holds it until it resumes, on the new weights), so every token of a turn
        # comes from one policy version. A stream already under way cannot be taken back: it ends with an error
        # event, and its turn is not recorded.
        self.resend_aborted = resend_aborted
        self.sessions: dict[str, Session] = {}  # by token
        self.by_id: dict[str, Session] = {}
        self.closed: OrderedDict[str, dict[str, Any] | Path] = OrderedDict()
        self._setup_metrics()

    # ------------------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> ProxyServer:
        """Listen and start watching the replicas.

        Raises:
            ProxyStartError: the address (or the Unix socket) cannot be listened on.
        """
        try:
            await self.http.start()
        except OSError as e:
            raise ProxyStartError(
                f"the proxy cannot listen on {self.http.host}:{self.http.port} ({e.strerror or e}). "
                "Fix: choose another --port (0 picks a free one), or stop what holds it."
            ) from e
        if self.discovery is not None:
            await self.discovery.refresh()
            self.discovery.start()
        self.pool.start()
        return self

    async def close(self) -> None:
        """Stop serving; sessions still open are closed (their trajectories written)."""
        await self.http.close()
        for session in list(self.by_id.values()):
            await self.close_session(session.id)
        if self.discovery is not None:
            await self.discovery.close()
        await self.pool.close()

    async def __aenter__(self) -> ProxyServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def port(self) -> int:
        return self.http.port

    @property
    def url(self) -> str:
        return f"http://{self.advertise_host or self.http.host}:{self.http.port}"

    async def wait_ready(self, timeout_s: float = 60.0, every: bool = False) -> bool:
        """True once a replica (``every``: each one) is healthy, probing now rather than at the next interval."""
        return await self.pool.wait_ready(timeout_s, every)

    # ------------------------------------------------------------------------------------------------ sessions
    def replace_upstream(self, old_url: str, new_url: str) -> None:
        """Route to ``new_url`` instead of ``old_url`` (a replica restarted on another port)."""
        host, port = parse_upstream(old_url)
        self.pool.remove(f"{host}:{port}")
        self.pool.add(new_url)

    def open_session(self, metadata: dict[str, Any] | None = None) -> SessionInfo:
        session = Session(metadata)
        self.sessions[session.token] = session
        self.by_id[session.id] = session
        self.m_sessions.inc()
        return self._info(session)

    def _info(self, session: Session) -> SessionInfo:
        base = f"{self.url}/sess/{session.token}"
        return SessionInfo(session.id, base + "/v1", base)

    def trajectory(self, session_id: str) -> dict[str, Any] | None:
        session = self.by_id.get(session_id)
        if session is not None:
            return session.trajectory()
        kept = self.closed.get(session_id)
        if isinstance(kept, Path):
            return orjson.loads(kept.read_bytes()) if kept.exists() else None
        return kept

    async def close_session(self, session_id: str) -> dict[str, Any] | None:
        """Close a session: its URL stops working at once; requests in flight finish and are recorded (for up to
        ``close_wait_s``); the trajectory is written to ``<trajectory_dir>/<id>.json`` and returned."""
        session = self.by_id.pop(session_id, None)
        if session is None:
            return None
        self.sessions.pop(session.token, None)
        if not await session.idle.wait(self.close_wait_s):
            log.warning("session %s closed with %d requests still in flight", session.id, session.idle.count)
        session.closed_at = time.time()
        trajectory = session.trajectory()
        kept: dict[str, Any] | Path = trajectory
        if self.trajectory_dir is not None:
            kept = await asyncio.to_thread(write_trajectory, self.trajectory_dir, trajectory)
            trajectory["path"] = str(kept)
        self.closed[session.id] = kept
        while len(self.closed) > CLOSED_KEPT:
            self.closed.popitem(last=False)
        return trajectory

    # ------------------------------------------------------------------------------------------------ metrics
    def _setup_metrics(self) -> None:
        r = self.registry = Registry()
        self.m_requests = r.add(
            Counter("runctl_proxy_requests_total", "Model calls by surface and status.", ("surface", "code"))
        )
        self.m_latency = r.add(
            Histogram("runctl_proxy_request_seconds", "Model call time, proxy in to proxy out.", ("surface",))
        )
        self.m_tokens = r.add(Counter("runctl_proxy_tokens_total", "Tokens through the proxy.", ("kind",)))
        self.m_failovers = r.add(
            Counter("runctl_proxy_failovers_total", "Requests sent to another replica after one failed.")
        )
        self.m_sessions = r.add(Counter("runctl_proxy_sessions_total", "Sessions opened."))
        self.m_resent = r.add(
            Counter(
                "runctl_proxy_aborted_total",
                "Answers a replica cut short (finish reason abort), by outcome.",
                ("outcome",),
            )
        )
        pool = self.pool
        r.add(Gauge("runctl_proxy_sessions_open", "Sessions open now.", (), lambda: {(): len(self.by_id)}))
        r.add(
            Gauge(
                "runctl_proxy_replica_in_flight",
                "Requests in flight per replica.",
                ("replica",),
                lambda: {(n,): x.in_flight for n, x in pool.replicas.items()},
            )
        )
        r.add(
            Gauge(
                "runctl_proxy_replica_up",
                "1 when a replica takes requests (up or asleep), else 0.",
                ("replica",),
                lambda: {(n,): float(x.state in (UP, ASLEEP)) for n, x in pool.replicas.items()},
            )
        )
        r.add(
            Gauge(
                "runctl_proxy_replica_requests",
                "Requests sent per replica.",
                ("replica",),
                lambda: {(n,): x.requests for n, x in pool.replicas.items()},
            )
        )

    # ------------------------------------------------------------------------------------------------ HTTP
    async def handle(self, req: Request, resp: Responder) -> None:
        path = req.path
        if path.startswith("/sess/"):
            end = path.find("/", 6)
            session = self.sessions.get(path[6:end] if end > 0 else path[6:])
            if session is None or end < 0:
                resp.send(404, NOT_FOUND)
                return
            await self._session_request(session, req, resp, path[end:])
        elif path == "/health":
            up = sum(r.state in (UP, ASLEEP) for r in self.pool.replicas.values())
            resp.send(
                200 if up else 503,
                orjson.dumps(
                    {
                        "status": "ok" if up else "no healthy replica",
                        "replicas_up": up,
                        "replicas": len(self.pool.replicas),
                    }
                ),
            )
        elif path == "/metrics":
            resp.send(200, self.registry.render(), b"text/plain; version=0.0.4")
        elif path == "/sessions" or path.startswith("/sessions/") or path == "/replicas":
            if not self._admin(req):
                resp.send(
                    401,
                    openai_error(
                        401,
                        "admin token required. Fix: send Authorization: Bearer <the proxy's admin token> "
                        "(RUNCTL_PROXY_ADMIN_TOKEN).",
                        "authentication_error",
                    ),
                )
                return
            await self._admin_request(req, resp)
        else:
            resp.send(404, NOT_FOUND)

    def _admin(self, req: Request) -> bool:
        given = req.headers.get(b"authorization", b"")
        return hmac.compare_digest(given, b"Bearer " + self.admin_token.encode())

    async def _admin_request(self, req: Request, resp: Responder) -> None:
        parts = req.path.strip("/").split("/")
        method = req.method
        if parts == ["replicas"] and method == "GET":
            resp.send(
                200,
                orjson.dumps(
                    {
                        "replicas": [r.describe() for r in self.pool.replicas.values()],
                        "ray_discovery_error": self.discovery.last_error if self.discovery else None,
                    }
                ),
            )
        elif parts == ["sessions"] and method == "POST":
            try:
                body = orjson.loads(req.body) if req.body.strip() else {}
            except orjson.JSONDecodeError:
                body = None
            if not isinstance(body, dict) or not isinstance(body.get("metadata", {}), dict):
                resp.send(
                    400,
                    openai_error(
                        400, 'body must be a JSON object, optionally {"metadata": {...}}', "invalid_request_error"
                    ),
                )
                return
            info = self.open_session(body.get("metadata"))
            resp.send(201, orjson.dumps(info.as_dict()))
        elif parts == ["sessions"] and method == "GET":
            listing = [
                {
                    "id": s.id,
                    "turns": len(s.turns),
                    "created_at": s.created_at,
                    "replica": s.replica,
                    "metadata": s.metadata,
                }
                for s in self.by_id.values()
            ]
            resp.send(200, orjson.dumps({"sessions": listing}))
        elif len(parts) == 3 and parts[0] == "sessions" and parts[2] == "trajectory" and method == "GET":
            trajectory = self.trajectory(parts[1])
            resp.send(200, orjson.dumps(trajectory)) if trajectory is not None else resp.send(404, NOT_FOUND)
        elif len(parts) == 2 and parts[0] == "sessions" and method == "DELETE":
            trajectory = await self.close_session(parts[1])
            if trajectory is None:
                resp.send(404, NOT_FOUND)
                return
            resp.send(
                200,
                orjson.dumps(
                    {
                        "id": parts[1],
                        "turns": len(trajectory["turns"]),
                        "sequences": len(trajectory["sequences"]),
                        "path": trajectory.get("path"),
                    }
                ),
            )
        else:
            resp.send(404, NOT_FOUND)

    async def _session_request(self, session: Session, req: Request, resp: Responder, rest: str) -> None:
        if rest == "/v1/chat/completions" and req.method == "POST":
            await self._openai(session, CHAT, "/v1/chat/completions", req, resp)
        elif rest == "/v1/completions" and req.method == "POST":
            await self._openai(session, COMPLETIONS, "/v1/completions", req, resp)
        elif rest == "/v1/messages" and req.method == "POST":
            await self._anthropic(session, req, resp)
        elif rest == "/v1/messages/count_tokens" and req.method == "POST":
            await self._count_tokens(session, req, resp)
        elif rest == "/v1/models" and req.method == "GET":
            served = self.models.served or self._learned_model() or ""
            created = int(time.time())
            names = [served] + [a for a in self.models.aliases if not any(c in a for c in "*?[")]
            data = [{"id": n, "object": "model", "created": created, "owned_by": "runctl"} for n in names if n]
            resp.send(200, orjson.dumps({"object": "list", "data": data}))
        else:
            resp.send(404, NOT_FOUND)

    def _learned_model(self) -> str | None:
        for replica in self.pool.replicas.values():
            if replica.served_model:
                return replica.served_model
        return None

    # ------------------------------------------------------------------------------------------------ upstream
    async def _send(self, session: Session, path: str, body: bytes) -> tuple[Replica, UpstreamResponse]:
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
                self.m_failovers.inc()
                continue
            except BaseException:
                replica.in_flight -= 1
                raise
            replica.requests += 1
            replica.answered()
            session.replica = replica.name
            return replica, upstream

    async def _whole(
        self, session: Session, path: str, payload: bytes
    ) -> tuple[Replica, int, bytes, dict[str, Any] | None]:
        """A non-streamed answer: the replica, the status, the body, and the body parsed when the status is 200. An
        answer a paused replica cut short is asked for again when ``resend_aborted`` is on (see ``__init__``)."""
        for _ in range(MAX_RESENDS + 1):
            replica, upstream = await self._send(session, path, payload)
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
            if not (self.resend_aborted and _cut_short(obj)):
                return replica, 200, data, obj
            self.m_resent.inc("resent")
            log.info("replica %s cut a request short (paused for a weight update); sending it again", replica.name)
        raise ProxyError(
            503,
            f"the replicas cut this request short {MAX_RESENDS + 1} times in a row (finish reason abort: paused for "
            "weight updates). Fix: send it again",
            "service_unavailable",
        )

    def _stream_cut_short(self, obj: dict[str, Any]) -> bool:
        """True (and counted) when a stream chunk ends a choice the replica cut short, which is not handed on."""
        if self.resend_aborted and _cut_short(obj):
            self.m_resent.inc("stream_ended")
            return True
        return False

    def _record(
        self,
        session: Session,
        surface: str,
        request: dict[str, Any],
        groups: list[tuple[list[int], list[Choice]]],
        replica: Replica,
        started: float,
        first_token_at: float | None,
        usage: dict[str, Any] | None,
    ) -> None:
        now = time.time()
        replica.answered()
        for prompt_ids, choices in groups:
            session.add_turn(
                Turn(
                    surface,
                    request,
                    prompt_ids,
                    choices,
                    replica.name,
                    started,
                    None if first_token_at is None else first_token_at - started,
                    now - started,
                    usage,
                )
            )
        if usage:
            self.m_tokens.inc("prompt", by=usage.get("prompt_tokens", 0) or 0)
            self.m_tokens.inc("completion", by=usage.get("completion_tokens", 0) or 0)

    @staticmethod
    def _body(req: Request) -> dict[str, Any]:
        try:
            body = orjson.loads(req.body)
        except orjson.JSONDecodeError as e:
            raise ProxyError(400, f"the request body is not JSON: {e}") from e
        if not isinstance(body, dict):
            raise ProxyError(400, "the request body must be a JSON object")
        return body

    async def _openai(self, session: Session, surface: str, path: str, req: Request, resp: Responder) -> None:
        started, t0 = time.time(), time.perf_counter()
        code = 200
        session.idle.enter()
        resp.cancel_when_gone()
        try:
            body = self._body(req)
            served = self.models.resolve(body.get("model"), self._learned_model())
            up, wants = upstream_body(surface, body, served)
            if not body.get("stream"):
                replica, code, data, obj = await self._whole(session, path, orjson.dumps(up))
                if obj is None:
                    resp.send(code, data)
                    session.errors += 1
                else:
                    groups = read_response(surface, obj, wants)
                    resp.send(200, orjson.dumps(obj))
                    self._record(session, surface, body, groups, replica, started, None, obj.get("usage"))
                return
            replica, upstream = await self._send(session, path, orjson.dumps(up))
            try:
                code = upstream.status
                if upstream.status != 200:
                    resp.send(upstream.status, await upstream.read())
                    session.errors += 1
                else:
                    capture = StreamCapture(surface, wants)
                    await self._relay_openai_stream(upstream, capture, resp)
                    self._record(
                        session,
                        surface,
                        body,
                        capture.groups(),
                        replica,
                        started,
                        capture.first_token_at,
                        capture.usage,
                    )
            finally:
                replica.in_flight -= 1
        except ProxyError as e:
            code = e.status
            session.errors += 1
            if not resp.started:
                resp.send(e.status, openai_error(e.status, e.message, e.kind))
        except (asyncio.CancelledError, ClientGone):
            code = CLIENT_GONE
            raise
        finally:
            session.idle.leave()
            self.m_requests.inc(surface, str(code))
            self.m_latency.observe(time.perf_counter() - t0, surface)

    async def _relay_openai_stream(self, upstream: UpstreamResponse, capture: StreamCapture, resp: Responder) -> None:
        resp.start_stream(200)
        reader = SSEReader()
        forward_raw = capture.wants.everything
        try:
            async for chunk in upstream.chunks():
                out: list[bytes] = []
                for payload in reader.feed(chunk):
                    if payload == b"[DONE]":
                        out.append(b"data: [DONE]\n\n")
                        continue
                    try:
                        obj = orjson.loads(payload)
                    except orjson.JSONDecodeError:
                        out.append(b"data: " + payload + b"\n\n")
                        continue
                    if self._stream_cut_short(obj):
                        await resp.write(
                            b"".join(out) + b"data: " + openai_error(503, PAUSED, "service_unavailable") + b"\n\n"
                        )
                        resp.end()
                        raise ProxyError(503, PAUSED, "service_unavailable")
                    capture.feed(obj)
                    out.append(b"data: " + (payload if forward_raw else orjson.dumps(obj)) + b"\n\n")
                if out:
                    await resp.write(b"".join(out))
        except UpstreamError as e:
            await resp.write(
                b"data: " + openai_error(502, f"the replica failed mid-stream: {e}", "upstream_error") + b"\n\n"
            )
            raise ProxyError(502, str(e), "upstream_error") from e
        finally:
            upstream.close() if resp.client_gone else None
        resp.end()

    async def _anthropic(self, session: Session, req: Request, resp: Responder) -> None:
        started, t0 = time.time(), time.perf_counter()
        code = 200
        session.idle.enter()
        resp.cancel_when_gone()
        try:
            body = self._body(req)
            try:
                chat = anth.to_openai(body)
            except TranslationError as e:
                raise ProxyError(400, str(e)) from e
            served = self.models.resolve(body.get("model"), self._learned_model())
            up, _ = upstream_body(CHAT, chat, served)
            model = str(body.get("model") or served)
            stops = list(body.get("stop_sequences") or ())
            if not body.get("stream"):
                replica, code, data, obj = await self._whole(session, "/v1/chat/completions", orjson.dumps(up))
                if obj is None:
                    resp.send(code, anth.error_body(code, anth.upstream_error_message(data)))
                    session.errors += 1
                    return
                groups = read_response(CHAT, obj, _EVERYTHING)
                message = anth.from_openai(obj, model, stops)
                resp.send(200, orjson.dumps(message))
                for _, choices in groups:
                    for choice in choices:
                        choice.output = message["content"]
                self._record(session, ANTHROPIC, body, groups, replica, started, None, obj.get("usage"))
                return
            replica, upstream = await self._send(session, "/v1/chat/completions", orjson.dumps(up))
            try:
                code = upstream.status
                if upstream.status != 200:
                    data = await upstream.read()
                    resp.send(upstream.status, anth.error_body(upstream.status, anth.upstream_error_message(data)))
                    session.errors += 1
                else:
                    capture = StreamCapture(CHAT, _EVERYTHING)
                    await self._relay_anthropic_stream(upstream, capture, anth.StreamTranslator(model, stops), resp)
                    groups = capture.groups()
                    for _, choices in groups:
                        for choice in choices:
                            choice.output = anth.output_blocks(choice.output)
                    self._record(
                        session, ANTHROPIC, body, groups, replica, started, capture.first_token_at, capture.usage
                    )
            finally:
                replica.in_flight -= 1
        except ProxyError as e:
            code = e.status
            session.errors += 1
            if not resp.started:
                resp.send(e.status, anth.error_body(e.status, e.message))
        except (asyncio.CancelledError, ClientGone):
            code = CLIENT_GONE
            raise
        finally:
            session.idle.leave()
            self.m_requests.inc(ANTHROPIC, str(code))
            self.m_latency.observe(time.perf_counter() - t0, ANTHROPIC)

    async def _relay_anthropic_stream(
        self, upstream: UpstreamResponse, capture: StreamCapture, translator: anth.StreamTranslator, resp: Responder
    ) -> None:
        resp.start_stream(200)
        reader = SSEReader()
        try:
            async for chunk in upstream.chunks():
                out = b""
                for payload in reader.feed(chunk):
                    if payload == b"[DONE]":
                        continue
                    try:
                        obj = orjson.loads(payload)
                    except orjson.JSONDecodeError:
                        continue
                    if "error" in obj and "choices" not in obj:
                        out += anth.event(
                            "error", orjson.loads(anth.error_body(500, anth.upstream_error_message(payload)))
                        )
                        continue
                    if self._stream_cut_short(obj):
                        error = orjson.loads(anth.error_body(503, PAUSED))
                        await resp.write(out + anth.event("error", error))
                        resp.end()
                        raise ProxyError(503, PAUSED, "service_unavailable")
                    capture.feed(obj)
                    out += translator.feed(obj)
                if out:
                    await resp.write(out)
        except UpstreamError as e:
            await resp.write(
                anth.event("error", orjson.loads(anth.error_body(502, f"the replica failed mid-stream: {e}")))
            )
            raise ProxyError(502, str(e), "upstream_error") from e
        finally:
            upstream.close() if resp.client_gone else None
        if not translator.started:
            await resp.write(translator.feed({}))
        await resp.write(translator.end())
        resp.end()

    async def _count_tokens(self, session: Session, req: Request, resp: Responder) -> None:
        try:
            body = self._body(req)
            chat = anth.to_openai(body)
            served = self.models.resolve(body.get("model"), self._learned_model())
            query: dict[str, Any] = {"model": served, "messages": chat["messages"], "add_generation_prompt": True}
            if chat.get("tools"):
                query["tools"] = chat["tools"]
            replica, upstream = await self._send(session, "/tokenize", orjson.dumps(query))
            try:
                data = await upstream.read()
            finally:
                replica.in_flight -= 1
            if upstream.status != 200:
                resp.send(upstream.status, anth.error_body(upstream.status, anth.upstream_error_message(data)))
                return
            resp.send(200, orjson.dumps({"input_tokens": orjson.loads(data).get("count", 0)}))
        except TranslationError as e:
            resp.send(400, anth.error_body(400, str(e)))
        except ProxyError as e:
            resp.send(e.status, anth.error_body(e.status, e.message))
