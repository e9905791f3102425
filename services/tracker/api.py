"""The tracker's HTTP API (FastAPI): runs and their events, read from the projection."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException, Query
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from services.tracker.db import EventRow, RunRow

MAX_PAGE = 500


def make_app(engine: Engine) -> FastAPI:
    """The API over a database engine."""
    app = FastAPI(title="runctl tracker", version="1", docs_url="/docs")

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        with Session(engine) as session:
            count = session.scalar(select(func.count()).select_from(EventRow))
        return {"ok": True, "events": count}

    @app.get("/runs")
    def list_runs(
        team: str | None = None,
        state: str | None = None,
        run_type: str | None = None,
        exp_name: str | None = None,
        limit: int = Query(100, ge=1, le=MAX_PAGE),
        offset: int = Query(0, ge=0),
    ) -> dict[str, Any]:
        """Runs, newest first, filtered by team, state, run type or experiment."""
        query = select(RunRow)
        for column, value in (
            (RunRow.team, team),
            (RunRow.state, state),
            (RunRow.run_type, run_type),
            (RunRow.exp_name, exp_name),
        ):
            if value is not None:
                query = query.where(column == value)
        with Session(engine) as session:
            total = session.scalar(select(func.count()).select_from(query.subquery()))
            rows = session.scalars(
                query.order_by(RunRow.submitted_at.desc().nulls_last(), RunRow.run_id).limit(limit).offset(offset)
            ).all()
            return {"total": total, "runs": [row.as_dict() for row in rows]}

    @app.get("/runs/{run_id}")
    def get_run(run_id: str, events: bool = True) -> dict[str, Any]:
        """One run with its resolved config and its events in the order they happened."""
        with Session(engine) as session:
            run = session.get(RunRow, run_id)
            if run is None:
                raise HTTPException(status_code=404, detail=f"no run {run_id!r} is recorded")
            body: dict[str, Any] = {"run": run.as_dict(), "resolved": run.resolved}
            if events:
                rows = session.scalars(
                    select(EventRow).where(EventRow.run_id == run_id).order_by(EventRow.time, EventRow.pk)
                ).all()
                body["events"] = [row.as_dict() for row in rows]
            return body

    return app
