"""Who is asking the tracker: every API route needs a token. A team's token (the team registry's) sees that team's
runs only; the admin token sees all.

A token comes as ``Authorization: Bearer <token>``, or as the session cookie the dashboard gets once from
``POST /api/session`` (so the browser's live stream, which cannot send headers, carries it too). The admin token is
``$RUNCTL_ADMIN_TOKEN``, else the one in ``$RUNCTL_HOME/admin-token`` — written there (mode 0600) by the first
tracker that found none, which is how the embedded stack's CLI reads it with no setup.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from runctl.teams import admin_token

__all__ = ["ADMIN", "COOKIE", "Authenticator", "Principal", "TokenAuth", "admin_token"]

COOKIE = "runctl_token"
CACHE_S = 2.0  # a rotated or removed team token stops working within this, plus the registry's own delay


@dataclass(frozen=True)
class Principal:
    """The admin (``team`` None) or one team."""

    team: str | None

    @property
    def admin(self) -> bool:
        return self.team is None

    def sees(self, team: str | None) -> bool:
        """True when this principal may read a run of ``team``."""
        return self.team is None or self.team == team


ADMIN = Principal(None)
Authenticator = Callable[[str], Awaitable[Principal | None]]


class TokenAuth:
    """The admin token, then the team registry (``lookup``: token → team name or None), each answer kept
    ``CACHE_S`` so a dashboard's burst of requests costs one registry read."""

    def __init__(self, admin: str | None, lookup: Callable[[str], Awaitable[str | None]] | None = None) -> None:
        self.admin = admin
        self.lookup = lookup
        self._cache: dict[str, tuple[float, Principal | None]] = {}

    async def __call__(self, token: str) -> Principal | None:
        if self.admin and hmac.compare_digest(token.encode(), self.admin.encode()):
            return ADMIN
        if self.lookup is None:
            return None
        now = time.monotonic()
        cached = self._cache.get(token)
        if cached is not None and cached[0] > now:
            return cached[1]
        team = await self.lookup(token)
        who = Principal(team) if team else None
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[token] = (now + CACHE_S, who)
        return who
