"""The tracker's tables (SQLAlchemy 2): one row per run, one row per event. SQLite by default."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, Integer, String, create_engine, event
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
            "submitted_at": _iso(self.submitted_at),
            "updated_at": _iso(self.updated_at),
            "ended_at": _iso(self.ended_at),
            "phase": self.phase,
            "last_step": self.last_step,
            "num_trials": self.num_trials,
            "num_events": self.num_events,
            "score": self.score,
            "synthetic": self.synthetic,
            "summary": self.summary,
            "error": self.error,
        }


class EventRow(Base):
    __tablename__ = "events"

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(200), unique=True)
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
            "time": _iso(self.time),
            "stream": self.stream,
            "stream_seq": self.stream_seq,
            "data": self.data,
        }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def make_engine(url: str) -> Engine:
    """A database engine with the tables created; SQLite gets WAL and a relaxed fsync for ingest speed."""
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

    Base.metadata.create_all(engine)
    return engine
