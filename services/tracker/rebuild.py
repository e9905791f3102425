"""``runctl tracker rebuild``: replay the event streams into an empty database.

The event log is the source of truth; the database is a projection of it. Replaying every stored event, stream by
stream in sequence order, through the same :func:`~services.tracker.projection.project` as the live tracker yields
the same records (the projection is idempotent and tolerant of how the two streams interleave).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import nats
from nats.js import api
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from runctl.bus import Bus
from runctl.bus.client import checked_event
from runctl.errors import RunctlError
from runctl.events import Event
from runctl.events.payloads import RUNS_STREAM, TRIALS_STREAM
from runctl.subjects import stream_team
from services.tracker.db import EventRow
from services.tracker.projection import project

log = logging.getLogger(__name__)
BATCH = 1000


class RebuildError(RunctlError):
    """The rebuild cannot start (the target database is not empty)."""


@dataclass
class RebuildReport:
    streams: dict[str, int] = field(default_factory=dict)
    """Events read from each stream."""
    stored: int = 0
    skipped: list[str] = field(default_factory=list)
    """Messages that are not valid events (the live tracker dead-letters them too)."""


async def stream_events(bus: Bus, stream: str) -> AsyncIterator[list[tuple[Event | str, int]]]:
    """Every event stored in ``stream`` now, oldest first, in batches of (event, stream sequence); invalid
    messages come as the reason they are not valid."""
    info = await bus.js.stream_info(stream)
    last = info.state.last_seq
    if info.state.messages == 0:
        return
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.NONE, deliver_policy=api.DeliverPolicy.ALL, inactive_threshold=60.0
    )
    sub = await bus.js.pull_subscribe("", stream=stream, config=config)
    try:
        seq = 0
        while seq < last:
            try:
                msgs = await sub.fetch(BATCH, timeout=5)
            except (TimeoutError, nats.errors.TimeoutError):
                break  # the stream's tail was removed by its limits while we read
            batch = []
            for msg in msgs:
                seq = int(msg.metadata.sequence.stream)
                batch.append((checked_event(msg.data, msg.subject), seq))
            yield batch
    finally:
        await sub.unsubscribe()


async def rebuild(bus: Bus, engine: Engine) -> RebuildReport:
    """Replay every team's runs stream, then every team's trials stream, into ``engine``'s database.

    Raises:
        RebuildError: the database already holds events (rebuild into an empty one).
    """
    with engine.connect() as conn:
        present = conn.scalar(select(func.count()).select_from(EventRow))
    if present:
        raise RebuildError(
            f"the target database already holds {present} events: a rebuild replays the whole log into an empty "
            "database. Fix: point --db (or RUNCTL_DB_URL) at a new SQLite file or an empty PostgreSQL database."
        )
    report = RebuildReport()
    names = await bus.stream_names()
    for family in (RUNS_STREAM, TRIALS_STREAM):  # every team's runs before any trial, as the projection wants
        for stream in sorted(name for name in names if stream_team(name, family) is not None):
            report.streams[stream] = await _replay(bus, engine, stream, report)
    return report


async def _replay(bus: Bus, engine: Engine, stream: str, report: RebuildReport) -> int:
    """Project one stream's events; how many it held."""
    read = 0
    async for batch in stream_events(bus, stream):
        read += len(batch)
        good = [(event, seq) for event, seq in batch if isinstance(event, Event)]
        report.skipped += [f"{stream}#{seq}: {event}" for event, seq in batch if not isinstance(event, Event)]
        with engine.begin() as conn:
            report.stored += len(project(conn, good))
    return read
