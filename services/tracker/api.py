"""The tracker's HTTP API (FastAPI; OpenAPI at ``/openapi.json``, browsable at ``/docs``) and the dashboard.

JSON under ``/api``; the dashboard's pages at ``/``, ``/runs/<id>``, ``/compare`` and ``/usage``, its assets under
``/static``; live updates as Server-Sent Events at ``/api/stream``; Prometheus at ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Body, Depends, FastAPI, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from services.tracker import artifacts, queries
from services.tracker.auth import ADMIN, COOKIE, Authenticator, Principal
from services.tracker.db import EventRow, RunRow, TrialRow, aware
from services.tracker.live import KEEPALIVE_S, Notifier

MAX_PAGE = 500
MAX_POINTS = 5000
MAX_INLINE_EVENTS = 10_000
"""Events ``GET /api/runs/{id}?events=true`` carries at most (the first ones); the answer then says how many there
are, and ``/api/runs/{id}/events`` pages through the rest."""
STATIC = Path(__file__).parent / "static"
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE)]
Offset = Annotated[int, Query(ge=0)]


def _json(body: dict[str, Any]) -> Response:
    """A large body straight to JSON (orjson), skipping FastAPI's validation of what it returns: for a long run's
    curves or trials that validation cost more than the query."""
    return Response(orjson.dumps(body), media_type="application/json")


def _split(value: str | None) -> list[str]:
    return [v for v in (value or "").split(",") if v]


def _db(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine) as session:
        yield session


def _token(request: Request) -> str:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.cookies.get(COOKIE, "")


async def principal(request: Request) -> Principal:
    """The admin or the team the request's token is (401 when it has none, or one that is no one's)."""
    return await _principal(request, _token(request))


async def _principal(request: Request, token: str) -> Principal:
    auth: Authenticator = request.app.state.auth
    who = await auth(token) if token else None
    if who is None:
        raise HTTPException(
            status_code=401,
            detail=(
                ("this token is no team's and not the admin's" if token else "the tracker needs a token")
                + ". Fix: send your team's token (RUNCTL_TOKEN, as `runctl team add` printed it) as "
                "'Authorization: Bearer <token>', or open the dashboard with `runctl dashboard --open`"
            ),
            headers={"WWW-Authenticate": "Bearer"},
        )
    return who


Db = Annotated[Session, Depends(_db)]
Who = Annotated[Principal, Depends(principal)]
router = APIRouter()


def run_or_404(session: Session, run_id: str, who: Principal) -> RunRow:
    """The run, if it is recorded and ``who`` may see it; another team's run is a 404 as a missing one is (its
    id tells nothing)."""
    run = session.get(RunRow, run_id)
    if run is None or not who.sees(run.team):
        raise HTTPException(status_code=404, detail=f"no run {run_id!r} is recorded; list the runs with GET /api/runs")
    return run


@router.get("/healthz")
async def healthz(request: Request) -> dict[str, Any]:
    """Liveness, for probes, with no token; with the admin token, also how many events are stored."""
    body: dict[str, Any] = {"ok": True}
    token = _token(request)
    if token and await request.app.state.auth(token) == ADMIN:
        with Session(request.app.state.engine) as session:
            body["events"] = session.scalar(select(func.count()).select_from(EventRow))
    return body


@router.post("/api/session")
async def login(request: Request, token: Annotated[str, Body(embed=True)] = "") -> Response:
    """Check a token (in the body, or as the Authorization header) and keep it in a cookie for this browser
    session, so the dashboard's pages and its live stream carry it."""
    token = token or _token(request)
    who = await _principal(request, token)
    response = _json({"team": who.team, "admin": who.admin})
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
    return response


@router.get("/api/session")
def whoami(who: Who) -> dict[str, Any]:
    """Who the request's token is."""
    return {"team": who.team, "admin": who.admin}


@router.delete("/api/session")
def logout() -> Response:
    response = _json({"ok": True})
    response.delete_cookie(COOKIE, path="/")
    return response


@router.get("/api/runs")
def list_runs(
    session: Db,
    who: Who,
    team: str | None = None,
    state: str | None = None,
    run_type: str | None = None,
    exp_name: str | None = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> dict[str, Any]:
    """Runs, newest first, filtered by team, state, run type or experiment (a team's token: its own runs only)."""
    query = select(RunRow)
    if not who.admin:
        query = query.where(RunRow.team == who.team)
    for column, value in (
        (RunRow.team, team),
        (RunRow.state, state),
        (RunRow.run_type, run_type),
        (RunRow.exp_name, exp_name),
    ):
        if value is not None:
            query = query.where(column == value)
    total = session.scalar(select(func.count()).select_from(query.subquery()))
    rows = session.scalars(
        query.order_by(RunRow.submitted_at.desc().nulls_last(), RunRow.updated_at.desc(), RunRow.run_id)
        .limit(limit)
        .offset(offset)
    ).all()
    return {"total": total, "runs": [row.as_dict() for row in rows]}


@router.get("/api/runs/{run_id}")
def get_run(session: Db, who: Who, run_id: str, events: bool = False) -> dict[str, Any]:
    """One run with its resolved config (and, with ``events=true``, its events in order: at most
    ``MAX_INLINE_EVENTS``, the answer saying so when there are more)."""
    run = run_or_404(session, run_id, who)
    body: dict[str, Any] = {"run": run.as_dict(), "resolved": run.resolved}
    if events:
        mine = EventRow.run_id == run_id
        rows = session.scalars(
            select(EventRow).where(mine).order_by(EventRow.time, EventRow.pk).limit(MAX_INLINE_EVENTS)
        ).all()
        body["events"] = [row.as_dict() for row in rows]
        if len(rows) == MAX_INLINE_EVENTS:
            total = session.scalar(select(func.count()).select_from(EventRow).where(mine)) or 0
            if total > len(rows):
                body["events_total"] = total
                body["events_truncated"] = (
                    f"the first {len(rows)} of {total} events; page through the rest with "
                    f"/api/runs/{run_id}/events?offset={len(rows)}&limit={MAX_PAGE}"
                )
    return body


@router.get("/api/runs/{run_id}/events")
def run_events(
    session: Db, who: Who, run_id: str, name: str | None = None, limit: Limit = 200, offset: Offset = 0
) -> Response:
    """The run's events in the order they happened, one page at a time; ``name`` keeps one kind."""
    query = select(EventRow).where(EventRow.run_id == run_id)
    if name is not None:
        query = query.where(EventRow.name == name)
    run_or_404(session, run_id, who)
    total = session.scalar(select(func.count()).select_from(query.subquery()))
    rows = session.scalars(query.order_by(EventRow.time, EventRow.pk).limit(limit).offset(offset)).all()
    return _json({"total": total, "events": [row.as_dict() for row in rows]})


@router.get("/api/runs/{run_id}/config")
def run_config(session: Db, who: Who, run_id: str) -> dict[str, Any]:
    """The resolved config: every key, its value, and the layer that set it."""
    return {"resolved": run_or_404(session, run_id, who).resolved}


@router.get("/api/runs/{run_id}/timeline")
def run_timeline(session: Db, who: Who, run_id: str) -> dict[str, Any]:
    run_or_404(session, run_id, who)
    return {"marks": queries.timeline(session, run_id)}


@router.get("/api/runs/{run_id}/validation")
def run_validation(session: Db, who: Who, run_id: str) -> dict[str, Any]:
    run_or_404(session, run_id, who)
    return queries.validation(session, run_id)


@router.get("/api/runs/{run_id}/metrics/keys")
def run_metric_keys(session: Db, who: Who, run_id: str) -> dict[str, Any]:
    run_or_404(session, run_id, who)
    return {"keys": queries.metric_keys(session, run_id)}


@router.get("/api/runs/{run_id}/metrics")
def run_metrics(
    session: Db,
    who: Who,
    run_id: str,
    keys: Annotated[str | None, Query(description="Comma-separated keys; default: the standard five.")] = None,
    max_points: Annotated[int, Query(ge=2, le=MAX_POINTS)] = 600,
) -> Response:
    """Metrics by step, each key downsampled to at most ``max_points`` (mean, min and max per bucket)."""
    run_or_404(session, run_id, who)
    return _json(queries.metrics(session, run_id, _split(keys) or list(queries.DEFAULT_KEYS), max_points))


@router.get("/api/runs/{run_id}/checkpoints")
def run_checkpoints(session: Db, who: Who, run_id: str) -> dict[str, Any]:
    """Checkpoints by step, each with the state and score of the eval run requested for it."""
    run_or_404(session, run_id, who)
    return {"checkpoints": queries.checkpoints(session, run_id)}


@router.get("/api/runs/{run_id}/tasks")
def run_tasks(session: Db, who: Who, run_id: str) -> dict[str, Any]:
    """Pass rate and mean reward of each task in the run."""
    run_or_404(session, run_id, who)
    return {"tasks": queries.task_rates(session, run_id)}


@router.get("/api/runs/{run_id}/trials")
def run_trials(
    session: Db,
    who: Who,
    run_id: str,
    task: str | None = None,
    termination_reason: str | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    limit: Limit = 200,
    offset: Offset = 0,
) -> Response:
    """The run's trials, by task and trial, filtered by task, termination reason or reward range."""
    query = select(TrialRow).where(TrialRow.run_id == run_id)
    if task is not None:
        query = query.where(TrialRow.task == task)
    if termination_reason is not None:
        query = query.where(TrialRow.termination_reason == termination_reason)
    if min_reward is not None:
        query = query.where(TrialRow.reward >= min_reward)
    if max_reward is not None:
        query = query.where(TrialRow.reward <= max_reward)
    run_or_404(session, run_id, who)
    total = session.scalar(select(func.count()).select_from(query.subquery()))
    rows = session.scalars(
        query.order_by(TrialRow.task, TrialRow.trial, TrialRow.time).limit(limit).offset(offset)
    ).all()
    return _json({"total": total, "trials": [row.as_dict() for row in rows]})


@router.get("/api/runs/{run_id}/trials/{task}/{trial}")
def run_trial(session: Db, who: Who, run_id: str, task: str, trial: Annotated[int, PathParam(ge=0)]) -> dict[str, Any]:
    """One trial: its record, its trajectory turn by turn, the verifier's output and the agent's logs."""
    run = run_or_404(session, run_id, who)
    return artifacts.trial_detail(run, task, trial)


@router.get("/api/tasks/pass-rates")
def pass_rates(
    session: Db,
    who: Who,
    run_ids: Annotated[str, Query(description="Comma-separated run ids.")],
    task: str | None = None,
) -> dict[str, Any]:
    """Each task's pass rate in each of the runs."""
    ids = _split(run_ids)
    if not who.admin:
        for run_id in ids:
            run_or_404(session, run_id, who)
    return {"tasks": queries.pass_rates_across(session, ids, task)}


@router.get("/api/usage")
def usage(
    session: Db,
    who: Who,
    team: str | None = None,
    since: Annotated[
        datetime | None, Query(description="Count only what was used from then on (ISO 8601 date or time; UTC).")
    ] = None,
) -> Response:
    """What each team and each run used: GPU-hours by role (rollout, training, eval), CPU-hours of CPU runs,
    sandbox-minutes and tokens generated, derived from the events (a team's token: its own only)."""
    now = datetime.now(UTC)
    if not who.admin:
        team = who.team if team in (None, who.team) else ""  # another team's: nothing this token may see
    return _json(queries.usage(session, team, aware(since) if since is not None else None, now))


@router.get("/api/stream")
async def stream(request: Request, who: Who, run_id: str | None = None) -> StreamingResponse:
    """Server-Sent Events: ``persisted`` whenever events of ``run_id`` (or of any run the token may see) are
    stored."""
    state = request.app.state
    return StreamingResponse(
        state.notifier.stream(run_id, state.keepalive_s, team=who.team),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/metrics", response_class=PlainTextResponse)
def prometheus(request: Request, who: Who) -> PlainTextResponse:
    """The tracker's own metrics (the admin token)."""
    if not who.admin:
        raise HTTPException(status_code=403, detail="the tracker's metrics are for the admin token")
    metrics = request.app.state.metrics
    body = metrics() if metrics is not None else b""
    return PlainTextResponse(body, media_type="text/plain; version=0.0.4")


@router.get("/", include_in_schema=False)
def runs_page() -> FileResponse:
    return FileResponse(STATIC / "index.html")


@router.get("/runs/{run_id}", include_in_schema=False)
def run_page(run_id: str) -> FileResponse:
    return FileResponse(STATIC / "run.html")


@router.get("/compare", include_in_schema=False)
def compare_page() -> FileResponse:
    return FileResponse(STATIC / "compare.html")


@router.get("/usage", include_in_schema=False)
def usage_page() -> FileResponse:
    return FileResponse(STATIC / "usage.html")


def make_app(
    engine: Engine,
    notifier: Notifier | None = None,
    metrics: Callable[[], bytes] | None = None,
    keepalive_s: float = KEEPALIVE_S,
    *,
    auth: Authenticator,
) -> FastAPI:
    """The API and dashboard over a database engine.

    Args:
        engine: the projection's database.
        auth: who a token is (services.tracker.auth.TokenAuth); every API route asks it.
        notifier: where the projector announces committed batches (live updates); None serves a stream that only
            keeps alive.
        metrics: the service's Prometheus exposition, served at ``/metrics``.
        keepalive_s: seconds between SSE keep-alive comments.
    """
    app = FastAPI(title="runctl tracker", version="1", docs_url="/docs")
    app.state.engine = engine
    app.state.notifier = notifier or Notifier()
    app.state.metrics = metrics
    app.state.auth = auth
    app.state.keepalive_s = keepalive_s
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC, check_dir=False), name="static")
    return app
