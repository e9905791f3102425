"""The tracker's projection and API over a real SQLite file, fed events directly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from fastapi import FastAPI

from runctl.config import resolve_text
from runctl.events import (
    ConfigValidated,
    Event,
    Payload,
    RunAdmitted,
    RunFailed,
    RunQueued,
    RunSucceeded,
    StepDone,
    TrialFinished,
    new_event,
)
from runctl.sdk import submission_event
from services.tracker.api import make_app
from services.tracker.auth import TokenAuth
from services.tracker.db import make_engine
from services.tracker.projection import project
from tests.conftest import ADMIN_TOKEN, admin_headers

# Every event a test stores has a time fixed from T0 (submissions included, see ``submitted``), so the order of
# events never depends on when a test runs.
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
TRAIN = "RUN_TYPE=train\nTEAM=nlp\nPROJECT_NAME=p\nEXP_NAME=e\nMODEL_PATH=/m\nTRAIN_FILES=/t\n"


def submitted(text: str) -> Event:
    """A ``config.submitted`` event for ``text``, at T0 (the moment every other event is timed from)."""
    return submission_event(resolve_text(text, "run.env", environ={})).model_copy(update={"time": T0})


def ev(payload: Payload, run_id: str, seconds: int, team: str = "nlp") -> Event:
    return new_event(payload, team=team, run_id=run_id, source="/test", time=T0 + timedelta(seconds=seconds))


def store(engine, events: list[Event]) -> list[str]:  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        return project(conn, [(e, i) for i, e in enumerate(events, 1)])


class Client:
    """The API in-process through httpx's ASGI transport."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def get(self, path: str, params: dict[str, object] | None = None) -> httpx.Response:
        transport = httpx.ASGITransport(app=self.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://tracker", headers=admin_headers()) as http:
            return await http.get(path, params=params)  # type: ignore[arg-type]


async def test_projection_is_idempotent_and_order_tolerant(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 't.db'}")
    submission = submitted(TRAIN)
    run_id = submission.runid
    events = [
        submission,
        ev(ConfigValidated(checks=[]), run_id, 1),
        ev(RunQueued(position=0, reason="r"), run_id, 2),
        ev(RunAdmitted(resources={"gpus": 0}, quota_decision="ok"), run_id, 3),
        ev(TrialFinished(task="a", trial=0, reward=1.0, termination_reason="agent_completed"), run_id, 4),
        ev(StepDone(step=1, metrics={"critic/score/mean": 0.5}), run_id, 5),
        ev(RunSucceeded(summary={"trials": 1}, score=1.0), run_id, 6),
    ]
    late = events[:3]
    assert len(store(engine, events[3:])) == 4  # arrives first: the run row is created from the envelope
    assert len(store(engine, late + events)) == 3  # repeats skipped, the late ones stored
    assert store(engine, events) == []
    client = Client(make_app(engine, auth=TokenAuth(ADMIN_TOKEN)))
    record = (await client.get(f"/api/runs/{run_id}", params={"events": "true"})).json()
    run = record["run"]
    assert run["state"] == "succeeded"  # the late config.submitted did not move it back
    assert (run["num_events"], run["num_trials"], run["last_step"], run["score"]) == (7, 1, 1, 1.0)
    assert (run["run_type"], run["exp_name"], run["team"]) == ("train", "e", "nlp")
    assert [e["name"] for e in record["events"]][0] == "config.submitted"
    assert record["resolved"]["TEAM"]["value"] == "nlp"


async def test_runs_are_listed_newest_first_and_filtered(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 't.db'}")
    first = submitted(TRAIN)
    second = submitted(TRAIN.replace("TEAM=nlp", "TEAM=vision")).model_copy(update={"time": T0 + timedelta(seconds=5)})
    store(engine, [first, second])
    store(engine, [ev(RunFailed(phase="ray", error_type="X", message="m. Fix: f", fix="f"), first.runid, 1)])
    client = Client(make_app(engine, auth=TokenAuth(ADMIN_TOKEN)))
    all_runs = (await client.get("/api/runs")).json()
    assert all_runs["total"] == 2
    assert (await client.get("/api/runs", params={"team": "vision"})).json()["runs"][0]["run_id"] == second.runid
    failed = (await client.get("/api/runs", params={"state": "failed"})).json()["runs"]
    assert [r["run_id"] for r in failed] == [first.runid]
    assert failed[0]["error"] == {"phase": "ray", "error_type": "X", "message": "m. Fix: f", "fix": "f"}
    assert (await client.get("/api/runs", params={"limit": 1})).json()["total"] == 2
    assert len((await client.get("/api/runs", params={"limit": 1})).json()["runs"]) == 1
    assert (await client.get("/api/runs", params={"limit": 0})).status_code == 422


async def test_unknown_run_is_a_404_with_a_message(tmp_path: Path) -> None:
    client = Client(make_app(make_engine(f"sqlite:///{tmp_path / 't.db'}"), auth=TokenAuth(ADMIN_TOKEN)))
    response = await client.get("/api/runs/nope")
    assert response.status_code == 404
    assert "nope" in response.json()["detail"]
