"""The tracker's tables (SQLAlchemy 2): runs, events, and what the run pages read (metrics by step, checkpoints,
trials). SQLite by default, PostgreSQL for a shared cluster; the schema is made and changed by the Alembic
migrations in ``migrations/`` (see :func:`make_engine`)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    Index,
    Integer,
    String,
    UniqueConstraint,
    create_engine,
    event,
    inspect,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class RunRow(Base):
    __tablename__ = "runs"

    run_id: Mapped[str] = mapped_column(String(160), primary_key=True)
    team: Mapped[str] = mapped_column(String(64), index=True)
    state: Mapped[str | None] = mapped_column(String(16), index=True)
    run_type: Mapped[str | None] = mapped_column(String(8))
    project_name: Mapped[str | None] = mapped_column(String(128))
    exp_name: Mapped[str | None] = mapped_column(String(128), index=True)
    engine: Mapped[str | None] = mapped_column(String(16))
    submitter: Mapped[str | None] = mapped_column(String(256))
    submitted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    phase: Mapped[str | None] = mapped_column(String(16))
    last_step: Mapped[int | None] = mapped_column(Integer)
    num_trials: Mapped[int] = mapped_column(Integer, default=0)
    num_events: Mapped[int] = mapped_column(Integer, default=0)
    score: Mapped[float | None] = mapped_column(Float)
    progress_total: Mapped[int | None] = mapped_column(Integer)
    """Units the run's loop will do (trials of an infer or eval run, steps of a train run), from phase.started."""
    synthetic: Mapped[bool] = mapped_column(default=False)
    resolved: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "team": self.team,
            "state": self.state,
            "run_type": self.run_type,
            "project_name": self.project_name,
            "exp_name": self.exp_name,
            "engine": self.engine,
            "submitter": self.submitter,
            "submitted_at": iso(self.submitted_at),
            "updated_at": iso(self.updated_at),
            "ended_at": iso(self.ended_at),
            "phase": self.phase,
            "last_step": self.last_step,
            "num_trials": self.num_trials,
            "num_events": self.num_events,
            "score": self.score,
            "progress": self.progress(),
            "duration_s": self.duration_s(),
            "synthetic": self.synthetic,
            "summary": self.summary,
            "error": self.error,
        }

    def progress(self) -> dict[str, Any] | None:
        if self.progress_total is None:
            return None
        if self.run_type == "train":
            return {"done": self.last_step or 0, "total": self.progress_total, "unit": "steps"}
        return {"done": self.num_trials or 0, "total": self.progress_total, "unit": "trials"}

    def duration_s(self) -> float | None:
        """Submitted to ended, or to now while the run is in flight."""
        if self.submitted_at is None:
            return None
        end = self.ended_at or datetime.now(UTC)
        return round((aware(end) - aware(self.submitted_at)).total_seconds(), 3)


class EventRow(Base):
    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_run_name_time", "run_id", "name", "time"),
        # An event is its team's, its run's and its id together: no team's event can take another's place.
        UniqueConstraint("team", "run_id", "id", name="uq_events_team_run_id"),
    )

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(200))
    run_id: Mapped[str] = mapped_column(String(160), index=True)
    team: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(64))
    type: Mapped[str] = mapped_column(String(96))
    source: Mapped[str] = mapped_column(String(128))
    time: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    stream: Mapped[str] = mapped_column(String(32))
    stream_seq: Mapped[int] = mapped_column(Integer)
    ingested_at: Mapped[float] = mapped_column(Float)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "type": self.type,
            "source": self.source,
            "time": iso(self.time),
            "stream": self.stream,
            "stream_seq": self.stream_seq,
            "data": self.data,
        }


class MetricRow(Base):
    """One metric of one step (``step.done``): narrow, so a page reads only the keys it draws."""

    __tablename__ = "metrics"
    # Stored in key order on SQLite (no rowid): a curve is one range read, the values beside their keys.
    __table_args__ = {"sqlite_with_rowid": False}

    run_id: Mapped[str] = mapped_column(String(160), primary_key=True)
    key: Mapped[str] = mapped_column(String(160), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    value: Mapped[float | None] = mapped_column(Float)
    """None for a value that was NaN or infinite (a diverged loss): drawn as a gap."""


class CheckpointRow(Base):
    """A checkpoint (``checkpoint.saved``) and the eval run requested for it (``eval.requested``), whichever
    arrives first."""

    __tablename__ = "checkpoints"

    run_id: Mapped[str] = mapped_column(String(160), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    path: Mapped[str | None] = mapped_column(String(1024))
    format: Mapped[str | None] = mapped_column(String(8))
    num_bytes: Mapped[int | None] = mapped_column(BigInteger)
    time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    eval_run_id: Mapped[str | None] = mapped_column(String(160), index=True)


class TrialRow(Base):
    """One ``trial.finished``."""

    __tablename__ = "trials"
    __table_args__ = (Index("ix_trials_run_task", "run_id", "task"),)

    run_id: Mapped[str] = mapped_column(String(160), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    task: Mapped[str] = mapped_column(String(256))
    trial: Mapped[int] = mapped_column(Integer)
    reward: Mapped[float | None] = mapped_column(Float)
    termination_reason: Mapped[str] = mapped_column(String(32))
    durations_s: Mapped[dict[str, float]] = mapped_column(JSON)
    tokens: Mapped[dict[str, int]] = mapped_column(JSON)
    time: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    def as_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "trial": self.trial,
            "reward": self.reward,
            "termination_reason": self.termination_reason,
            "durations_s": self.durations_s,
            "tokens": self.tokens,
            "time": iso(self.time),
        }


class TaskStatsRow(Base):
    """Trial counts of one task in one run, added to as ``trial.finished`` events are stored: sums, so the order
    in which trials arrive does not matter."""

    __tablename__ = "task_stats"

    run_id: Mapped[str] = mapped_column(String(160), primary_key=True)
    task: Mapped[str] = mapped_column(String(256), primary_key=True)
    num_trials: Mapped[int] = mapped_column(Integer)
    num_scored: Mapped[int] = mapped_column(Integer)
    """Trials with a valid reward (an error counts for neither pass nor fail)."""
    passes: Mapped[int] = mapped_column(Integer)
    reward_sum: Mapped[float] = mapped_column(Float)


class TokenUsageRow(Base):
    """Completion tokens a run's trials generated in one hour (UTC, by when each trial ended), added to as
    ``trial.finished`` events are stored: usage over a window reads these hours, not every trial."""

    __tablename__ = "token_usage"

    run_id: Mapped[str] = mapped_column(String(160), primary_key=True)
    hour: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    team: Mapped[str] = mapped_column(String(64), index=True)
    tokens_generated: Mapped[int] = mapped_column(BigInteger)


def hour_of(value: datetime) -> datetime:
    """The UTC hour ``value`` falls in (a naive value, as SQLite hands back, is UTC)."""
    return aware(value).astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def iso(value: datetime | None) -> str | None:
    return aware(value).isoformat() if value is not None else None


def aware(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; every time stored is UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


MIGRATIONS = Path(__file__).parent / "migrations"


def normalized_url(url: str) -> str:
    """A PostgreSQL URL without a driver gets psycopg 3 (the driver runctl installs), not SQLAlchemy's default."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str) -> Engine:
    """A database engine with its schema migrated to the newest revision.

    SQLite gets WAL and a relaxed fsync for ingest speed. A database made before the tracker used migrations
    (its tables, no ``alembic_version``) is recognised as revision 0001 and upgraded from there.
    """
    url = normalized_url(url)
    is_sqlite = url.startswith("sqlite")
    engine = create_engine(url, connect_args={"check_same_thread": False} if is_sqlite else {})
    if is_sqlite:

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA busy_timeout=5000")
            cursor.close()

    migrate(engine)
    return engine


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to ``revision`` (Alembic), in one transaction."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        tables = set(inspect(conn).get_table_names())
        if "runs" in tables and "alembic_version" not in tables:
            command.stamp(config, "0001")
        command.upgrade(config, revision)
