"""Events into rows. Idempotent: an event already stored is skipped, and the run state only moves forward. An event is
known by its team, its run and its id together: another team's event that carries the same id (a guessed or copied
one) is stored beside it, never in its place, and changes no run of another team.

Order-tolerant: the runs stream and the trials stream are consumed separately, so a run's rows may be built
from its events in any interleaving of the two; every row comes out the same (a rebuild from the streams yields
the records the live projection made)."""

from __future__ import annotations

import json
import logging
import math
import time
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from runctl.events import (
    CheckpointSaved,
    ConfigRejected,
    ConfigSubmitted,
    EvalRequested,
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
from runctl.layout import PASS_THRESHOLD
from services.tracker.db import (
    Base,
    CheckpointRow,
    EventRow,
    MetricRow,
    RunRow,
    TaskStatsRow,
    TokenUsageRow,
    TrialRow,
    hour_of,
)

log = logging.getLogger(__name__)


def project(conn: Connection, batch: list[tuple[Event, int]]) -> list[str]:
    """Store a batch of (event, stream sequence) and update their runs, inside the caller's transaction.

    A few statements per batch whatever its size: one insert of the events that skips ids already stored, one
    select of their runs, one write per run touched.

    Returns:
        The ids of the events that were new (repeats are skipped).
    """
    fresh: dict[tuple[str, str, str], tuple[Event, int]] = {}
    for event, seq in batch:
        fresh.setdefault((event.team, event.runid, event.id), (event, seq))
    now = time.time()
    rows = [
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
        for event, seq in fresh.values()
    ]
    stored = _insert_new_events(conn, rows)
    new = [event for key, (event, _) in fresh.items() if key in stored]
    if not new:
        return []
    runs_table = Base.metadata.tables[RunRow.__tablename__]
    run_ids = {event.runid for event in new}
    found = {row.run_id: row for row in conn.execute(select(runs_table).where(runs_table.c.run_id.in_(run_ids)))}
    runs: dict[str, RunRow] = {}
    derived = _Derived()
    for event in new:
        run = runs.get(event.runid)
        if run is None:
            row = found.get(event.runid)
            run = RunRow(**row._mapping) if row is not None else _new_run(event)
            runs[event.runid] = run
        if run.team != event.team:
            # Stored in the log, but another team cannot change this run's record.
            log.warning(
                "event %s from team %s ignored for run %s of team %s", event.id, event.team, run.run_id, run.team
            )
            continue
        apply_to_run(run, event)
        derived.add(event)
    for run_id, run in runs.items():
        values = {column.name: getattr(run, column.name) for column in runs_table.columns}
        if run_id in found:
            conn.execute(update(runs_table).where(runs_table.c.run_id == run_id).values(values))
        else:
            conn.execute(insert(runs_table).values(values))
    derived.write(conn)
    return [event.id for event in new]


def _new_run(event: Event) -> RunRow:
    return RunRow(run_id=event.runid, team=event.team, num_trials=0, num_events=0, synthetic=False)


class _Derived:
    """The metric, checkpoint and trial rows of a batch's new events, written in a few statements."""

    def __init__(self) -> None:
        self.metrics: list[dict[str, Any]] = []
        self.trials: list[dict[str, Any]] = []
        self.checkpoints: dict[tuple[str, int], dict[str, Any]] = {}
        self.task_stats: dict[tuple[str, str], list[float]] = {}  # num_trials, num_scored, passes, reward_sum
        self.tokens: dict[tuple[str, datetime], tuple[str, int]] = {}  # (run, hour) -> (team, completion tokens)

    def add(self, event: Event) -> None:
        data = event.data
        if isinstance(data, StepDone):
            self.metrics += [
                {"run_id": event.runid, "key": key, "step": data.step, "value": value if math.isfinite(value) else None}
                for key, value in data.metrics.items()
            ]
        elif isinstance(data, TrialFinished):
            self.trials.append(
                {
                    "event_id": event.id,
                    "run_id": event.runid,
                    "task": data.task,
                    "trial": data.trial,
                    "reward": data.reward,
                    "termination_reason": data.termination_reason,
                    "durations_s": data.durations_s,
                    "tokens": data.tokens,
                    "time": event.time,
                }
            )
            hour = hour_of(event.time)
            team, generated = self.tokens.get((event.runid, hour), (event.team, 0))
            self.tokens[(event.runid, hour)] = (team, generated + int(data.tokens.get("completion", 0)))
            counts = self.task_stats.setdefault((event.runid, data.task), [0, 0, 0, 0.0])
            counts[0] += 1
            if data.reward is not None:
                counts[1] += 1
                counts[2] += data.reward >= PASS_THRESHOLD
                counts[3] += data.reward
        elif isinstance(data, CheckpointSaved):
            row = self.checkpoints.setdefault((event.runid, data.step), {})
            row |= {"path": data.path, "format": data.format, "num_bytes": data.num_bytes, "time": event.time}
        elif isinstance(data, EvalRequested):
            self.checkpoints.setdefault((data.parent_run, data.checkpoint_step), {})["eval_run_id"] = data.eval_run_id

    def write(self, conn: Connection) -> None:
        if self.metrics:
            _insert_missing(conn, MetricRow.__tablename__, self.metrics, ["run_id", "key", "step"])
        if self.trials:
            _insert_missing(conn, TrialRow.__tablename__, self.trials, ["run_id", "event_id"])
            _add_task_stats(conn, self.task_stats)
            _add_tokens(conn, self.tokens)
        table = Base.metadata.tables[CheckpointRow.__tablename__]
        for (run_id, step), values in self.checkpoints.items():
            # One checkpoint row, whichever of checkpoint.saved and eval.requested comes first; a repeat of either
            # (a resumed run saving the step again) sets the same columns again.
            where = (table.c.run_id == run_id) & (table.c.step == step)
            if conn.execute(update(table).where(where).values(values)).rowcount == 0:
                conn.execute(insert(table).values(run_id=run_id, step=step, **values))


def _add_task_stats(conn: Connection, stats: dict[tuple[str, str], list[float]]) -> None:
    """Add a batch's trial counts to each (run, task) row, making the row on its first trial."""
    columns = ("num_trials", "num_scored", "passes", "reward_sum")
    rows = [
        {"run_id": run_id, "task": task, **dict(zip(columns, counts, strict=True))}
        for (run_id, task), counts in stats.items()
    ]
    _add_counts(conn, TaskStatsRow.__tablename__, ["run_id", "task"], columns, rows)


def _add_tokens(conn: Connection, tokens: dict[tuple[str, datetime], tuple[str, int]]) -> None:
    """Add a batch's generated tokens to each (run, hour) row, making the row on its first trial."""
    rows = [
        {"run_id": run_id, "hour": hour, "team": team, "tokens_generated": count}
        for (run_id, hour), (team, count) in tokens.items()
    ]
    _add_counts(conn, TokenUsageRow.__tablename__, ["run_id", "hour"], ("tokens_generated",), rows)


def _add_counts(
    conn: Connection, name: str, keys: list[str], columns: tuple[str, ...], rows: list[dict[str, Any]]
) -> None:
    """Add each row's ``columns`` to the stored row of its ``keys``, inserting the rows not stored yet."""
    table = Base.metadata.tables[name]
    dialect = conn.dialect.name
    if dialect in ("sqlite", "postgresql"):
        module = sqlite if dialect == "sqlite" else postgresql
        statement = module.insert(table)
        added = {c: table.c[c] + statement.excluded[c] for c in columns}
        conn.execute(statement.on_conflict_do_update(index_elements=keys, set_=added), rows)
        return
    for row in rows:
        where = [table.c[k] == row[k] for k in keys]
        increments = {c: table.c[c] + row[c] for c in columns}
        if conn.execute(update(table).where(*where).values(increments)).rowcount == 0:
            conn.execute(insert(table).values(row))


def _insert_missing(conn: Connection, name: str, rows: list[dict[str, Any]], keys: list[str]) -> None:
    """Insert rows whose key is not stored yet (the first value of a metric step wins: live and rebuild agree)."""
    table = Base.metadata.tables[name]
    dialect = conn.dialect.name
    if dialect in ("sqlite", "postgresql"):
        module = sqlite if dialect == "sqlite" else postgresql
        conn.execute(module.insert(table).on_conflict_do_nothing(index_elements=keys), rows)
        return
    for row in rows:
        where = [table.c[k] == row[k] for k in keys]
        if conn.execute(select(table.c[keys[0]]).where(*where)).first() is None:
            conn.execute(insert(table).values(row))


def _insert_new_events(conn: Connection, rows: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """Insert events whose (team, run, id) is not stored yet; return the (team, run, id) of those inserted."""
    table = Base.metadata.tables[EventRow.__tablename__]
    keys = ["team", "run_id", "id"]
    dialect = conn.dialect.name
    if dialect in ("sqlite", "postgresql"):
        module = sqlite if dialect == "sqlite" else postgresql
        statement = module.insert(table).on_conflict_do_nothing(index_elements=keys)
        returned = conn.execute(statement.returning(table.c.team, table.c.run_id, table.c.id), rows)
        return {(row.team, row.run_id, row.id) for row in returned}
    ids = [row["id"] for row in rows]
    stored = conn.execute(select(table.c.team, table.c.run_id, table.c.id).where(table.c.id.in_(ids)))
    seen = {(row.team, row.run_id, row.id) for row in stored}
    todo = [row for row in rows if (row["team"], row["run_id"], row["id"]) not in seen]
    if todo:
        conn.execute(insert(table), todo)
    return {(row["team"], row["run_id"], row["id"]) for row in todo}


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
        if data.total is not None:
            run.progress_total = data.total
    elif isinstance(data, TrialFinished):
        run.num_trials = (run.num_trials or 0) + 1
    elif isinstance(data, StepDone):
        run.last_step = max(run.last_step or 0, data.step)
    elif isinstance(data, RunSucceeded):
        run.score, run.summary = data.score, data.summary
    elif isinstance(data, RunFailed):
        run.error = {"phase": data.phase, "error_type": data.error_type, "message": data.message, "fix": data.fix}
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
