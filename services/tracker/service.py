"""The tracker service: projects every event into SQL and serves the HTTP API.

After each committed batch it sends a core-NATS notice (``_runctl.tracker.persisted``) with the stored ids and
the commit time, for live views and for measuring publish-to-persisted latency.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator

import uvicorn
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from runctl.bus import Bus, ConsumerSpec, Delivery
from runctl.events import Event
from runctl.events.payloads import RUNS_STREAM, TRIALS_STREAM
from runctl.metrics import Gauge
from runctl.service import ServiceRuntime
from runctl.subjects import persisted_subject
from runctl.teams import TeamRegistry
from services.tracker.api import make_app
from services.tracker.auth import TokenAuth, admin_token
from services.tracker.db import EventRow, make_engine
from services.tracker.live import Notifier
from services.tracker.projection import project
from services.tracker.settings import TrackerSettings

log = logging.getLogger(__name__)

CONSUMERS = [
    ConsumerSpec(durable="tracker-runs", stream=RUNS_STREAM, filter_subjects=[], batch=256),
    ConsumerSpec(durable="tracker-trials", stream=TRIALS_STREAM, filter_subjects=[], batch=256),
]


class Projector:
    """Writes delivered batches. The write is synchronous on the event loop (about a millisecond for a small
    batch): the two stream consumers can never interleave a commit, and there is no thread hand-off, which under
    the GIL's 5 ms switch interval cost more latency than the write itself."""

    def __init__(self, engine: Engine, bus: Bus, notifier: Notifier) -> None:
        self.engine = engine
        self.bus = bus
        self.notifier = notifier
        self.stored = 0

    def write(self, batch: list[tuple[Event, int]]) -> tuple[list[str], float]:
        with self.engine.begin() as conn:
            ids = project(conn, batch)
        return ids, time.time()

    async def handle(self, batch: list[Delivery]) -> None:
        ids, committed_at = self.write([(d.event, d.stream_seq) for d in batch])
        self.stored += len(ids)
        if ids:
            notice = {"ids": ids, "committed_at": committed_at}
            await self.bus.nc.publish(persisted_subject(), json.dumps(notice).encode())
            stored = set(ids)
            events = [d.event for d in batch if d.event.id in stored]
            self.notifier.publish({e.runid: e.team for e in events}, sorted({e.name for e in events}), len(ids))


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the service runtime owns SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def main(runtime: ServiceRuntime, settings: TrackerSettings) -> None:
    assert runtime.bus is not None
    url = settings.database()
    engine = make_engine(url)
    notifier = Notifier()
    projector = Projector(engine, runtime.bus, notifier)
    metrics = runtime.metrics
    metrics.add(
        Gauge(
            "runctl_tracker_events_stored_total",
            "Events stored by this tracker process (repeats excluded).",
            (),
            lambda: {(): float(projector.stored)},
            kind="counter",
        )
    )
    clients = Gauge("runctl_tracker_live_clients", "Open live-update streams.", (), lambda: {(): notifier.num_clients})
    metrics.add(clients)
    host, port = settings.host, settings.port
    registry = TeamRegistry(runtime.bus)

    async def team_of(token: str) -> str | None:
        team = await registry.by_token(token)
        return team.name if team is not None else None

    app = make_app(engine, notifier, metrics.render, auth=TokenAuth(admin_token(create=True), team_of))
    server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))

    def health() -> dict[str, object]:
        with Session(engine) as session:
            total = session.scalar(select(func.count()).select_from(EventRow))
        return {"api": f"http://{host}:{port}", "events_stored": total, "db": url.split("://", 1)[0]}

    async def stop_server() -> None:
        server.should_exit = True

    runtime.health_info(health)
    runtime.on_stop(stop_server)
    runtime.spawn(server.serve())
    for spec in CONSUMERS:
        await runtime.consume(spec, projector.handle)
