"""Live updates for the dashboard: after each committed batch the projector tells the notifier which runs changed,
and every Server-Sent Events client watching one of them gets a ``persisted`` event (then refetches what it shows).

A slow client never holds the projector back: its queue is bounded and a full queue drops the notice (the next
one tells it to refetch anyway).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

KEEPALIVE_S = 15.0
QUEUE = 64


class Notifier:
    """Fans committed-batch notices out to the SSE clients."""

    def __init__(self) -> None:
        # (the run watched or None for all, the team whose runs it may hear of or None for all, its queue)
        self._clients: set[tuple[str | None, str | None, asyncio.Queue[dict[str, Any]]]] = set()
        self.sent = 0
        self.dropped = 0

    @property
    def num_clients(self) -> int:
        return len(self._clients)

    def publish(self, runs: Mapping[str, str], names: list[str], count: int) -> None:
        """Tell the clients that ``count`` events of ``runs`` (run id → its team) were stored. A team's client
        hears only of its own team's runs."""
        for run_id, team, queue in list(self._clients):
            heard = sorted(r for r, t in runs.items() if team is None or t == team)
            if not heard or (run_id is not None and run_id not in heard):
                continue
            notice = {"runs": heard, "names": names, "count": count if len(heard) == len(runs) else None}
            try:
                queue.put_nowait(notice)
                self.sent += 1
            except asyncio.QueueFull:
                self.dropped += 1

    async def stream(
        self, run_id: str | None, keepalive_s: float = KEEPALIVE_S, team: str | None = None
    ) -> AsyncIterator[str]:
        """SSE text for one client: a ``ready`` event, then a ``persisted`` event per notice about ``run_id`` (or
        about any run of ``team``, or of any team), with a comment every ``keepalive_s`` so proxies keep the
        connection open."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE)
        client = (run_id, team, queue)
        self._clients.add(client)
        try:
            yield f"retry: 2000\nevent: ready\ndata: {json.dumps({'run_id': run_id})}\n\n"
            while True:
                try:
                    notice = await asyncio.wait_for(queue.get(), timeout=keepalive_s)
                except TimeoutError:
                    yield ": keepalive\n\n"
                    continue
                yield f"event: persisted\ndata: {json.dumps(notice)}\n\n"
        finally:
            self._clients.discard(client)
