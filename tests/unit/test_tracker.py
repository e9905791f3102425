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
from services.tracker.db import make_engine
from services.tracker.projection import project

# Later than any config.submitted a test makes now (those carry the current time), so event order is fixed.
T0 = datetime.now(UTC) + timedelta(hours=1)
TRAIN = "RUN_TYPE=train\nTEAM=nlp\nPROJECT_NAME=p\nEXP_NAME=e\nMODEL_PATH=/m\nTRAIN_FILES=/t\n"


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
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://tracker") as http:
            return await http.get(path, params=params)  # type: ignore[arg-type]


async def test_projection_is_idempotent_and_order_tolerant(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 't.db'}")
    submitted = submission_event(resolve_text(TRAIN, "run.env", environ={}))
    run_id = submitted.runid
    events = [
        submitted,
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
    client = Client(make_app(engine))
    record = (await client.get(f"/api/runs/{run_id}", params={"events": "true"})).json()
    run = record["run"]
    assert run["state"] == "succeeded"  # the late config.submitted did not move it back
    assert (run["num_events"], run["num_trials"], run["last_step"], run["score"]) == (7, 1, 1, 1.0)
    assert (run["run_type"], run["exp_name"], run["team"]) == ("train", "e", "nlp")
    assert [e["name"] for e in record["events"]][0] == "config.submitted"
    assert record["resolved"]["TEAM"]["value"] == "nlp"


async def test_runs_are_listed_newest_first_and_filtered(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 't.db'}")
    first = submission_event(resolve_text(TRAIN, "run.env", environ={}))
    second = submission_event(resolve_text(TRAIN.replace("TEAM=nlp", "TEAM=vision"), "run.env", environ={}))
    store(engine, [first, second])
    store(engine, [ev(RunFailed(phase="ray", error_type="X", message="m"), first.runid, 1)])
    client = Client(make_app(engine))
    all_runs = (await client.get("/api/runs")).json()
    assert all_runs["total"] == 2
    assert (await client.get("/api/runs", params={"team": "vision"})).json()["runs"][0]["run_id"] == second.runid
    failed = (await client.get("/api/runs", params={"state": "failed"})).json()["runs"]
    assert [r["run_id"] for r in failed] == [first.runid]
    assert failed[0]["error"] == {"phase": "ray", "error_type": "X", "message": "m"}
    assert (await client.get("/api/runs", params={"limit": 1})).json()["total"] == 2
    assert len((await client.get("/api/runs", params={"limit": 1})).json()["runs"]) == 1
    assert (await client.get("/api/runs", params={"limit": 0})).status_code == 422


async def test_unknown_run_is_a_404_with_a_message(tmp_path: Path) -> None:
    client = Client(make_app(make_engine(f"sqlite:///{tmp_path / 't.db'}")))
    response = await client.get("/api/runs/nope")
    assert response.status_code == 404
    assert "nope" in response.json()["detail"]
