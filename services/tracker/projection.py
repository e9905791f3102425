"""Events into rows. Idempotent: an event id already stored is skipped, and the run state only moves forward."""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from runctl.events import (
    ConfigRejected,
    ConfigSubmitted,
    Event,
    PhaseStarted,
    RunFailed,
    RunState,
    RunSucceeded,
    StepDone,
    TrialFinished,
    next_state,
)
from runctl.events.state import TERMINAL
from services.tracker.db import EventRow, RunRow

log = logging.getLogger(__name__)


def project(session: Session, batch: list[tuple[Event, int]]) -> list[str]:
    """Store a batch of (event, stream sequence) and update their runs; the caller commits.

    Events go in with one multi-row insert and their runs are loaded with one query, so a batch costs a few
    statements whatever its size.

    Returns:
        The ids of the events that were new (repeats are skipped).
    """
    ids = [event.id for event, _ in batch]
    seen = set(session.scalars(select(EventRow.id).where(EventRow.id.in_(ids))))
    fresh: list[tuple[Event, int]] = []
    for event, seq in batch:
        if event.id not in seen:
            seen.add(event.id)
            fresh.append((event, seq))
    if not fresh:
        return []
    now = time.time()
    session.execute(
        insert(EventRow),
        [
            {
                "id": event.id,
                "run_id": event.runid,
                "team": event.team,
                "name": event.name,
                "type": event.type,
                "source": event.source,
                "time": event.time,
                "stream": event.stream,
                "stream_seq": seq,
                "ingested_at": now,
                "data": json.loads(event.data.model_dump_json()),  # JSON-safe: NaN stays the string "NaN"
            }
            for event, seq in fresh
        ],
    )
    run_ids = {event.runid for event, _ in fresh}
    with session.no_autoflush:
        runs = {run.run_id: run for run in session.scalars(select(RunRow).where(RunRow.run_id.in_(run_ids)))}
        for event, _ in fresh:
            run = runs.get(event.runid)
            if run is None:
                run = RunRow(run_id=event.runid, team=event.team, num_trials=0, num_events=0, synthetic=False)
                session.add(run)
                runs[event.runid] = run
            if run.team != event.team:
                # Stored in the log, but another team cannot change this run's record.
                log.warning(
                    "event %s from team %s ignored for run %s of team %s", event.id, event.team, run.run_id, run.team
                )
                continue
            apply_to_run(run, event)
    return [event.id for event, _ in fresh]


def apply_to_run(run: RunRow, event: Event) -> None:
    """Fold one event into its run's row."""
    data = event.data
    phase = data.phase if isinstance(data, PhaseStarted) else None
    current = RunState(run.state) if run.state else None
    new = next_state(current, event.name, phase)
    run.state = new.value if new else None
    run.num_events = (run.num_events or 0) + 1
    run.updated_at = _later(run.updated_at, event.time)
    if getattr(data, "synthetic", False):
        run.synthetic = True
    if isinstance(data, ConfigSubmitted):
        run.run_type, run.project_name, run.exp_name = data.run_type, data.project_name, data.exp_name
        run.engine, run.submitter, run.submitted_at = data.engine, data.via + ":" + data.submitter, event.time
        run.resolved = data.resolved
    elif isinstance(data, PhaseStarted) and current not in TERMINAL:
        run.phase = data.phase
    elif isinstance(data, TrialFinished):
        run.num_trials = (run.num_trials or 0) + 1
    elif isinstance(data, StepDone):
        run.last_step = max(run.last_step or 0, data.step)
    elif isinstance(data, RunSucceeded):
        run.score, run.summary = data.score, data.summary
    elif isinstance(data, RunFailed):
        run.error = {"phase": data.phase, "error_type": data.error_type, "message": data.message}
    elif isinstance(data, ConfigRejected):
        run.error = {
            "phase": "validate",
            "error_type": "ConfigRejected",
            "checks": [c.model_dump() for c in data.checks],
        }
    if new in TERMINAL and current not in TERMINAL:
        run.ended_at = event.time


def _later(a: datetime | None, b: datetime) -> datetime:
    if a is None:
        return b
    if a.tzinfo is None:  # SQLite hands back naive datetimes
        a = a.replace(tzinfo=b.tzinfo)
    return max(a, b)
