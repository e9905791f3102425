"""A runner's side of the launcher's desk (``services/launcher/desk.py`` says what it answers): a request about the
run the bus login belongs to, answered as JSON, retried through a short outage (the launcher restarting)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import nats.errors

from runctl.bus.client import Bus
from runctl.errors import BusError, DeskRefusedError
from runctl.subjects import desk_subject

#: How long a request is retried while the launcher does not answer (it restarts within this).
RETRY_WINDOW_S = 60.0


async def ask(bus: Bus, op: str, body: dict[str, Any] | None = None, timeout_s: float = 30.0) -> dict[str, Any]:
    """The desk's answer to ``op`` about the run of ``bus``'s login.

    Raises:
        DeskRefusedError: the desk refused (the message says why).
        BusError: no answer within the retry window.
    """
    if bus.run is None:
        raise BusError("this bus connection is not a run's login: it has no desk to ask")
    team, run_id = bus.run
    subject = desk_subject(team, run_id, op)
    deadline, delay = time.monotonic() + RETRY_WINDOW_S, 0.2
    while True:
        try:
            msg = await bus.nc.request(subject, json.dumps(body or {}).encode(), timeout=timeout_s)
            reply: dict[str, Any] = json.loads(msg.data)
            if reply.pop("ok", False):
                return reply
            if not reply.get("retry"):
                raise DeskRefusedError(f"the launcher's desk refused {op} for run {run_id}: {reply.get('error')}")
            problem = str(reply.get("error"))
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError, nats.errors.ConnectionClosedError) as e:
            problem = f"{type(e).__name__}: {e}"
        if time.monotonic() + delay > deadline:
            waited = f"{RETRY_WINDOW_S:.0f}s"
            raise BusError(f"the launcher's desk did not answer {op} for run {run_id} for {waited}: {problem}")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)
