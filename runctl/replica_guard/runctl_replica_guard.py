"""The key every request to a run's vLLM replica must carry.

A replica is started with ``--middleware runctl_replica_guard.RequireKey``, this folder on ``PYTHONPATH`` (so any
Python with vLLM finds it, whether or not runctl is installed there) and the key in ``VLLM_API_KEY`` (its
environment, not its command line, which every user of the machine can read). Every request but ``GET /health``
must then carry ``Authorization: Bearer <key>``; anything else is answered 401 before vLLM sees it.

vLLM's own ``--api-key`` guards only the model surfaces (``/v1``, ``/v2``, ...), not the development endpoints a train
run's replicas open (``/collective_rpc`` loads weights from any folder, ``/sleep``, ``/pause``,
``/reset_prefix_cache``), nor ``/metrics`` or ``/tokenize``. The run's proxy, its weight sync and its readiness wait
hold the key; nothing else on the machine does.

Standard library only: it runs inside the replica's process.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

KEY_ENV = "VLLM_API_KEY"
#: (method, path) a request may send without the key: the liveness probe, which tells nothing.
OPEN = frozenset({("GET", "/health")})
REFUSED = b'{"error":"Unauthorized: this vLLM replica answers only its own run (runctl replica key)"}'

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
App = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


class RequireKey:
    """Pure ASGI middleware: every request but ``OPEN`` carries ``Authorization: Bearer $VLLM_API_KEY``."""

    def __init__(self, app: App) -> None:
        key = os.environ.get(KEY_ENV, "")
        if not key:
            raise RuntimeError(
                f"{KEY_ENV} is not set: runctl_replica_guard will not let this replica start without a key. Fix: "
                "start replicas through runctl (each run makes a key of its own), or set VLLM_API_KEY."
            )
        self.app = app
        self._digest = hashlib.sha256(key.encode()).digest()

    async def __call__(
        self, scope: Scope, receive: Callable[[], Awaitable[Message]], send: Callable[[Message], Awaitable[None]]
    ) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket") or (scope.get("method"), scope.get("path")) in OPEN:
            await self.app(scope, receive, send)
            return
        if self.carries_key(scope.get("headers") or ()):
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(REFUSED)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": REFUSED})

    def carries_key(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether the one ``authorization`` header is ``Bearer <key>`` (compared in constant time)."""
        found = [value for name, value in headers if name.lower() == b"authorization"]
        if len(found) != 1:
            return False
        scheme, _, token = found[0].strip().partition(b" ")
        given = hashlib.sha256(token.strip()).digest()
        return scheme.lower() == b"bearer" and hmac.compare_digest(given, self._digest)
