"""The proxy's admin API, with ``Authorization: Bearer <admin token>``: open, list and close sessions, read a
trajectory, list the replicas (docs/services.md)."""

from __future__ import annotations

import hmac
from collections.abc import Callable

import orjson

from services.proxy.errors import NOT_FOUND
from services.proxy.http11 import Request, Responder
from services.proxy.openai_surface import openai_error
from services.proxy.replicas import RayDiscovery, ReplicaPool
from services.proxy.sessions import Sessions

UNAUTHORIZED = openai_error(
    401,
    "admin token required. Fix: send Authorization: Bearer <the proxy's admin token> (RUNCTL_PROXY_ADMIN_TOKEN).",
    "authentication_error",
)
BAD_SESSION_BODY = openai_error(
    400,
    'body must be a JSON object, optionally {"metadata": {...}, "max_turns": N} (N a whole number from 1)',
    "invalid_request_error",
)


def is_admin_path(path: str) -> bool:
    return path == "/sessions" or path.startswith("/sessions/") or path == "/replicas"


class AdminApi:
    def __init__(
        self,
        token: str,
        sessions: Sessions,
        pool: ReplicaPool,
        discovery: RayDiscovery | None,
        url: Callable[[], str],
    ) -> None:
        self.token = token
        self._bearer = b"Bearer " + token.encode()
        self.sessions = sessions
        self.pool = pool
        self.discovery = discovery
        self.url = url

    async def handle(self, req: Request, resp: Responder) -> None:
        if not hmac.compare_digest(req.headers.get(b"authorization", b""), self._bearer):
            resp.send(401, UNAUTHORIZED)
            return
        parts = req.path.strip("/").split("/")
        method = req.method
        if parts == ["replicas"] and method == "GET":
            replicas = [r.describe() for r in self.pool.replicas.values()]
            error = self.discovery.last_error if self.discovery else None
            resp.send(200, orjson.dumps({"replicas": replicas, "ray_discovery_error": error}))
        elif parts == ["sessions"] and method == "POST":
            try:
                body = orjson.loads(req.body) if req.body.strip() else {}
            except orjson.JSONDecodeError:
                body = None
            max_turns = body.get("max_turns") if isinstance(body, dict) else None
            if (
                not isinstance(body, dict)
                or not isinstance(body.get("metadata", {}), dict)
                or not (max_turns is None or (type(max_turns) is int and max_turns >= 1))
            ):
                resp.send(400, BAD_SESSION_BODY)
                return
            opened = self.sessions.open(body.get("metadata"), self.url(), max_turns)
            resp.send(201, orjson.dumps(opened.as_dict()))
        elif parts == ["sessions"] and method == "GET":
            resp.send(200, orjson.dumps({"sessions": self.sessions.listing()}))
        elif len(parts) == 3 and parts[0] == "sessions" and parts[2] == "trajectory" and method == "GET":
            trajectory = self.sessions.trajectory(parts[1])
            resp.send(200, orjson.dumps(trajectory)) if trajectory is not None else resp.send(404, NOT_FOUND)
        elif len(parts) == 2 and parts[0] == "sessions" and method == "DELETE":
            trajectory = await self.sessions.close(parts[1])
            if trajectory is None:
                resp.send(404, NOT_FOUND)
                return
            turns, sequences = len(trajectory["turns"]), len(trajectory["sequences"])
            closed = {"id": parts[1], "turns": turns, "sequences": sequences, "path": trajectory.get("path")}
            resp.send(200, orjson.dumps(closed))
        else:
            resp.send(404, NOT_FOUND)
