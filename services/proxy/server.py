"""The proxy server: per-session OpenAI and Anthropic endpoints before vLLM replicas, with trajectory capture.

In process (the agent loop)::

    async with ProxyServer(["http://127.0.0.1:8000"], trajectory_dir=trial_dir) as proxy:
        session = proxy.open_session({"trial": "t-1"})
        ...  # give the agent session.openai_base_url or session.anthropic_base_url
        trajectory = await proxy.close_session(session.id)

Over HTTP, the admin API (``Authorization: Bearer <admin token>``, ``admin.py``) does the same: ``POST /sessions``,
``GET /sessions/{id}/trajectory``, ``DELETE /sessions/{id}``; plus ``GET /sessions``, ``GET /replicas``.
Unauthenticated: ``GET /health`` and ``GET /metrics``. A session's endpoints live under ``/sess/<token>/``; an
unknown or closed token gets the same 404 as any unknown path. Each model call there lives one life
(``lifecycle.py``) whichever API it came in on (``surface.py``).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import orjson

from services.proxy.admin import AdminApi, is_admin_path
from services.proxy.anthropic_surface import AnthropicSurface
from services.proxy.errors import NOT_FOUND, ProxyStartError
from services.proxy.http11 import HttpServer, Request, Responder
from services.proxy.lifecycle import Lifecycle
from services.proxy.names import DEFAULT_ALIASES, ModelNames
from services.proxy.openai_surface import CHAT, COMPLETIONS, OpenAISurface
from services.proxy.replicas import ASLEEP, UP, RayDiscovery, ReplicaPool, parse_upstream
from services.proxy.sessions import SessionInfo, Sessions
from services.proxy.stats import ProxyMetrics
from services.proxy.surface import Surface
from services.proxy.trajectory import Session
from services.proxy.upstream import Upstream

__all__ = ["DEFAULT_ALIASES", "ProxyServer", "SessionInfo"]

#: A session's model-call endpoints: (method, path under /sess/<token>) → the API it speaks.
SURFACES: dict[tuple[str, str], Surface] = {
    ("POST", "/v1/chat/completions"): OpenAISurface(CHAT, "/v1/chat/completions"),
    ("POST", "/v1/completions"): OpenAISurface(COMPLETIONS, "/v1/completions"),
    ("POST", "/v1/messages"): AnthropicSurface(),
}


class ProxyServer:
    """See the module docstring. ``port=0`` takes an ephemeral port; ``advertise_host`` is the host put in session
    URLs (default: the bind host), for agents that reach the proxy by another name. ``unix_socket``: also listen
    there (a sandbox without a network reaches the proxy through it, bound in). ``resend_aborted``: see
    :class:`~services.proxy.upstream.Upstream`. ``upstream_key``: the bearer key the replicas require (a run's
    replica key), sent with every request to them and never shown. ``ray_namespace``: discover only that namespace's
    replicas (a run's own; None: every namespace's)."""

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
        upstream_key: str | None = None,
        ray_namespace: str | None = None,
    ) -> None:
        self.pool = ReplicaPool(interval_s=health_interval_s, probe_timeout_s=probe_timeout_s, key=upstream_key)
        for url in upstreams:
            self.pool.add(url)
        self.discovery = (
            RayDiscovery(self.pool, ray_address, health_interval_s, ray_namespace) if discover_ray else None
        )
        self.http = HttpServer(self.handle, host, port, str(unix_socket) if unix_socket else None)
        self.advertise_host = advertise_host
        self.admin_token = admin_token or secrets.token_urlsafe(32)
        self.metrics = ProxyMetrics(self.pool, lambda: len(self.sessions.by_id))
        self.sessions = Sessions(Path(trajectory_dir) if trajectory_dir else None, close_wait_s, self.metrics.sessions)
        self.models = ModelNames(served_model, aliases)
        self.upstream = Upstream(self.pool, self.metrics, request_timeout_s, resend_aborted)
        self.calls = Lifecycle(self.upstream, self.models, self.metrics)
        self.admin = AdminApi(self.admin_token, self.sessions, self.pool, self.discovery, lambda: self.url)

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
        for session_id in list(self.sessions.by_id):
            await self.close_session(session_id)
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

    @property
    def by_id(self) -> dict[str, Session]:
        """The open sessions by id."""
        return self.sessions.by_id

    async def wait_ready(self, timeout_s: float = 60.0, every: bool = False) -> bool:
        """True once a replica (``every``: each one) is healthy, probing now rather than at the next interval."""
        return await self.pool.wait_ready(timeout_s, every)

    def replace_upstream(self, old_url: str, new_url: str) -> None:
        """Route to ``new_url`` instead of ``old_url`` (a replica restarted on another port)."""
        host, port = parse_upstream(old_url)
        self.pool.remove(f"{host}:{port}")
        self.pool.add(new_url)

    def open_session(self, metadata: dict[str, Any] | None = None, max_turns: int | None = None) -> SessionInfo:
        """See :meth:`Sessions.open <services.proxy.sessions.Sessions.open>`."""
        return self.sessions.open(metadata, self.url, max_turns)

    def trajectory(self, session_id: str) -> dict[str, Any] | None:
        return self.sessions.trajectory(session_id)

    async def close_session(self, session_id: str) -> dict[str, Any] | None:
        """See :meth:`Sessions.close <services.proxy.sessions.Sessions.close>`."""
        return await self.sessions.close(session_id)

    async def handle(self, req: Request, resp: Responder) -> None:
        path = req.path
        if path.startswith("/sess/"):
            end = path.find("/", 6)
            session = self.sessions.by_token.get(path[6:end] if end > 0 else path[6:])
            if session is None or end < 0:
                resp.send(404, NOT_FOUND)
                return
            await self._session_request(session, req, resp, path[end:])
        elif path == "/health":
            up = sum(r.state in (UP, ASLEEP) for r in self.pool.replicas.values())
            status = {"status": "ok" if up else "no healthy replica", "replicas_up": up}
            resp.send(200 if up else 503, orjson.dumps({**status, "replicas": len(self.pool.replicas)}))
        elif path == "/metrics":
            resp.send(200, self.metrics.registry.render(), b"text/plain; version=0.0.4")
        elif is_admin_path(path):
            await self.admin.handle(req, resp)
        else:
            resp.send(404, NOT_FOUND)

    async def _session_request(self, session: Session, req: Request, resp: Responder, rest: str) -> None:
        surface = SURFACES.get((req.method, rest))
        if surface is not None:
            await self.calls.serve(surface, session, req, resp)
        elif rest == "/v1/messages/count_tokens" and req.method == "POST":
            await self.calls.count_tokens(session, req, resp)
        elif rest == "/v1/models" and req.method == "GET":
            data = self.models.listed(self.upstream.learned_model(), int(time.time()))
            resp.send(200, orjson.dumps({"object": "list", "data": data}))
        else:
            resp.send(404, NOT_FOUND)
