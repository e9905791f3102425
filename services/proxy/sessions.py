"""The proxy's sessions: one per agent run, each with URLs of its own (``/sess/<token>/``) and a trajectory that is
written when it closes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from runctl.metrics import Counter
from services.proxy.trajectory import Session, write_trajectory

log = logging.getLogger(__name__)

CLOSED_KEPT = 1024
"""Closed sessions whose trajectory (or its file) the admin API still answers for."""


@dataclass(frozen=True)
class SessionInfo:
    id: str
    openai_base_url: str
    anthropic_base_url: str

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "openai_base_url": self.openai_base_url, "anthropic_base_url": self.anthropic_base_url}


class Sessions:
    """Open sessions by token (a request's lookup) and by id (the admin's), and the last ``CLOSED_KEPT`` closed."""

    def __init__(self, trajectory_dir: Path | None, close_wait_s: float, opened: Counter) -> None:
        self.trajectory_dir = trajectory_dir
        self.close_wait_s = close_wait_s
        self.opened = opened
        self.by_token: dict[str, Session] = {}
        self.by_id: dict[str, Session] = {}
        self.closed: OrderedDict[str, dict[str, Any] | Path] = OrderedDict()

    def open(self, metadata: dict[str, Any] | None, url: str, max_turns: int | None = None) -> SessionInfo:
        """A new session; ``url`` is the proxy's, which its endpoints live under; ``max_turns``: the policy turns it
        answers (the trial's AGENT_MAX_ITERATIONS), after which it refuses the policy's calls."""
        session = Session(metadata, max_turns)
        self.by_token[session.token] = session
        self.by_id[session.id] = session
        self.opened.inc()
        base = f"{url}/sess/{session.token}"
        return SessionInfo(session.id, base + "/v1", base)

    def trajectory(self, session_id: str) -> dict[str, Any] | None:
        session = self.by_id.get(session_id)
        if session is not None:
            return session.trajectory()
        kept = self.closed.get(session_id)
        if isinstance(kept, Path):
            return orjson.loads(kept.read_bytes()) if kept.exists() else None
        return kept

    async def close(self, session_id: str) -> dict[str, Any] | None:
        """Close a session: its URL stops working at once; requests in flight finish and are recorded (for up to
        ``close_wait_s``); the trajectory is written to ``<trajectory_dir>/<id>.json`` and returned."""
        session = self.by_id.pop(session_id, None)
        if session is None:
            return None
        self.by_token.pop(session.token, None)
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

    def listing(self) -> list[dict[str, Any]]:
        return [
            {
                "id": s.id,
                "turns": len(s.turns),
                "max_turns": s.max_turns,
                "created_at": s.created_at,
                "replica": s.replica,
                "metadata": s.metadata,
            }
            for s in self.by_id.values()
        ]
