"""The tracker's API over a recorded event stream, on SQLite and on a real PostgreSQL server.

The stream (``tests/data/tracker/stream.jsonl``, see its README) holds a fake-engine train run with 40 steps and
4 checkpoints, each evaluated by an eval run, a rejected run, and a real CPU infer run and eval run whose trial
folders are under ``tests/data/tracker/home``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, insert, inspect, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from runctl.events import Event, parse_event
from services.tracker import queries
from services.tracker.api import make_app
from services.tracker.auth import TokenAuth
from services.tracker.db import Base, make_engine, migrate, normalized_url
from services.tracker.projection import project
from tests.conftest import ADMIN_TOKEN, ROOT, admin_headers
from tests.infra.postgres import new_database

pytestmark = pytest.mark.integration

DATA = ROOT / "tests" / "data" / "tracker"
TRAIN = "grpo-fake-20261130-ece8"
INFER = "infer-cpu-20261130-92e5"
EVAL = "eval-cpu-20261130-1e11"
REJECTED = "grpo-tp3-20261130-0410"
_names = count()


def recorded() -> list[Event]:
    return [parse_event(line.encode()) for line in (DATA / "stream.jsonl").read_text().splitlines() if line]


def load(engine: Engine, events: list[Event], batch: int = 100) -> int:
    stored = 0
    for start in range(0, len(events), batch):
        with engine.begin() as conn:
            stored += len(project(conn, [(e, i) for i, e in enumerate(events[start : start + batch], start + 1)]))
    return stored


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tracker.db'}"
    admin: str = request.getfixturevalue("postgres")
    return new_database(admin, f"t{next(_names)}")


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


TEAM_TOKENS = {"rct_demo.d3m0": "demo", "rct_nlp.n1p": "nlp"}


async def team_of(token: str) -> str | None:
    return TEAM_TOKENS.get(token)


@pytest.fixture
def app(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> FastAPI:
    monkeypatch.setenv("RUNCTL_HOME", str(DATA / "home"))
    assert load(engine, recorded()) == len(recorded())
    return make_app(engine, auth=TokenAuth(ADMIN_TOKEN, team_of))


@pytest.fixture
def api(app: FastAPI) -> Iterator[httpx.Client]:
    with TestClient(app, base_url="http://tracker", headers=admin_headers()) as client:
        yield client


def get(api: httpx.Client, path: str, **params: Any) -> Any:
    response = api.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_schema_made_by_the_migrations_is_the_models_schema(engine: Engine) -> None:
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        assert conn.scalar(text("SELECT version_num FROM alembic_version")) == "0005"


def test_a_database_made_before_migrations_is_upgraded_in_place(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = create_engine(url)
    migrate(old, "0001")
    with old.begin() as conn:  # the tables as create_all made them, with no record of a revision
        conn.execute(text("DROP TABLE alembic_version"))
        conn.execute(
            text("INSERT INTO runs (run_id, team, num_trials, num_events, synthetic) VALUES ('r1', 'nlp', 0, 0, 0)")
        )
    old.dispose()
    engine = make_engine(url)
    with engine.connect() as conn:
        assert {"metrics", "checkpoints", "trials"} <= set(inspect(conn).get_table_names())
        assert conn.scalar(text("SELECT run_id FROM runs")) == "r1"  # nothing lost
    engine.dispose()


def test_upgrading_counts_the_trials_already_stored_into_the_task_grid(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'at-0002.db'}"
    old = create_engine(url)
    migrate(old, "0002")
    with old.begin() as conn:
        for k, reward in enumerate([1.0, 0.0, None, 0.5]):
            conn.execute(
                text(
                    "INSERT INTO trials (event_id, run_id, task, trial, reward, termination_reason, durations_s,"
                    " tokens, time) VALUES (:id, 'r1', 'say-yes', :k, :reward, 'agent_completed', '{}', '{}',"
                    " '2026-11-30')"
                ),
                {"id": f"e{k}", "k": k, "reward": reward},
            )
    old.dispose()
    engine = make_engine(url)
    with Session(engine) as session:
        assert queries.task_rates(session, "r1") == [
            {"task": "say-yes", "num_trials": 4, "passes": 1, "pass_rate": 0.333333, "mean_reward": 0.5}
        ]
    engine.dispose()


def test_upgrading_to_events_per_team_and_run_keeps_every_event_and_trial(db_url: str, tmp_path: Path) -> None:
    """0004 moves the events' uniqueness from the id to (team, run, id) and the trials' key to (run, event id):
    what 0003 stored stays, and a second team's event with a stored id is then stored beside it."""
    events = [e for e in recorded() if e.runid == INFER]
    source = make_engine(f"sqlite:///{tmp_path / 'rows.db'}")
    load(source, events)
    old = create_engine(normalized_url(db_url))
    migrate(old, "0003")
    with source.connect() as rows, old.begin() as conn:  # the same rows, as 0003 held them
        for table in ("runs", "events", "trials", "task_stats", "metrics", "checkpoints"):
            found = [dict(r._mapping) for r in rows.execute(select(Base.metadata.tables[table]))]
            for row in found:
                row.pop("pk", None)  # the database numbers its events itself
            if found:
                conn.execute(insert(Base.metadata.tables[table]), found)
    source.dispose()
    with old.connect() as conn:
        before = {t: conn.scalar(text(f"SELECT count(*) FROM {t}")) for t in ("events", "trials", "runs")}
    old.dispose()
    engine = make_engine(db_url)
    with engine.connect() as conn:
        assert {t: conn.scalar(text(f"SELECT count(*) FROM {t}")) for t in before} == before
        assert conn.scalar(text("SELECT version_num FROM alembic_version")) == "0005"
        trials = conn.execute(text("SELECT tokens FROM trials")).scalars().all()
        spent = sum(int((t if isinstance(t, dict) else json.loads(t)).get("completion", 0)) for t in trials)
        assert spent > 0 and conn.scalar(text("SELECT sum(tokens_generated) FROM token_usage")) == spent  # 0005
    copy = events[-1].model_copy(update={"team": "other"})
    assert load(engine, [copy]) == 1 and load(engine, [copy]) == 0
    engine.dispose()


def test_projection_is_idempotent_under_redelivery(engine: Engine) -> None:
    events = recorded()
    assert load(engine, events) == len(events)
    assert load(engine, events[::-1], batch=37) == 0  # every event again, reordered: nothing new
    with engine.connect() as conn:
        counts = {t: conn.scalar(text(f"SELECT count(*) FROM {t}")) for t in ("events", "metrics", "trials")}
        trials = conn.scalar(text(f"SELECT num_trials FROM runs WHERE run_id = '{TRAIN}'"))
    assert counts == {"events": len(events), "metrics": 40 * 5, "trials": 320 + 4 * 8 + 12 + 6}
    assert trials == 320


def test_runs_are_filtered_paged_and_show_progress_and_score(api: httpx.Client) -> None:
    everything = get(api, "/api/runs")
    assert everything["total"] == 8
    ids = [r["run_id"] for r in everything["runs"]]
    submitted = {e.runid: e.time for e in recorded() if e.name == "config.submitted"}
    assert ids == sorted(submitted, key=lambda run_id: submitted[run_id], reverse=True)  # newest first
    evals = get(api, "/api/runs", run_type="eval")
    assert evals["total"] == 5
    assert [r["run_id"] for r in get(api, "/api/runs", state="rejected")["runs"]] == [REJECTED]
    assert get(api, "/api/runs", team="nlp")["total"] == 1
    assert [r["run_id"] for r in get(api, "/api/runs", exp_name="infer-cpu")["runs"]] == [INFER]
    page = get(api, "/api/runs", limit=3, offset=3)
    assert (page["total"], [r["run_id"] for r in page["runs"]]) == (8, ids[3:6])
    train = next(r for r in everything["runs"] if r["run_id"] == TRAIN)
    assert train["progress"] == {"done": 40, "total": 40, "unit": "steps"}
    assert (train["state"], train["score"], train["synthetic"]) == ("succeeded", 0.375, True)
    infer = next(r for r in everything["runs"] if r["run_id"] == INFER)
    assert infer["progress"] == {"done": 12, "total": 12, "unit": "trials"}
    assert infer["score"] == pytest.approx(0.583333)
    assert infer["duration_s"] == pytest.approx(44.0, abs=15)
    assert api.get("/api/runs", params={"limit": 0}).status_code == 422


def test_metrics_are_selected_by_key_and_downsampled(api: httpx.Client) -> None:
    steps = {e.data.step: e.data.metrics for e in recorded() if e.name == "step.done"}  # type: ignore[union-attr]
    keys = get(api, f"/api/runs/{TRAIN}/metrics/keys")["keys"]
    assert keys == sorted(steps[1])
    full = get(api, f"/api/runs/{TRAIN}/metrics", keys="actor/entropy")
    assert list(full["series"]) == ["actor/entropy"] and not full["downsampled"]
    assert full["series"]["actor/entropy"]["steps"] == list(range(1, 41))
    assert full["series"]["actor/entropy"]["values"] == [steps[s]["actor/entropy"] for s in range(1, 41)]
    small = get(api, f"/api/runs/{TRAIN}/metrics", keys="critic/score/mean,response_length/mean", max_points=8)
    assert small["downsampled"] and small["num_steps"] == 40
    lengths = small["series"]["response_length/mean"]
    assert len(lengths["steps"]) <= 8 and lengths["steps"][-1] == 40  # each bucket drawn at its last step
    edges = [0, *lengths["steps"]]
    for k, (low, high) in enumerate(itertools.pairwise(edges)):
        bucket = [steps[s]["response_length/mean"] for s in range(low + 1, high + 1)]
        assert len(bucket) > 1  # downsampled: every point stands for several steps
        assert lengths["values"][k] == pytest.approx(sum(bucket) / len(bucket))
        assert (lengths["min"][k], lengths["max"][k]) == (min(bucket), max(bucket))
    default = get(api, f"/api/runs/{TRAIN}/metrics")
    assert set(default["series"]) == set(steps[1])  # the five standard curves
    assert get(api, f"/api/runs/{INFER}/metrics")["series"] == {}


def test_checkpoints_carry_the_score_of_their_eval_run(api: httpx.Client) -> None:
    checkpoints = get(api, f"/api/runs/{TRAIN}/checkpoints")["checkpoints"]
    assert [c["step"] for c in checkpoints] == [10, 20, 30, 40]
    assert all(c["eval_state"] == "succeeded" and c["eval_score"] == 0.375 for c in checkpoints)
    assert checkpoints[0]["eval_run_id"].startswith("eval-step10-")
    assert checkpoints[-1]["path"].endswith("checkpoints/global_step_40") and checkpoints[-1]["format"] == "hf"


def test_the_timeline_runs_from_submission_to_the_end_with_durations(api: httpx.Client) -> None:
    marks = get(api, f"/api/runs/{TRAIN}/timeline")["marks"]
    names = [m["name"] for m in marks]
    for earlier, later in zip(
        ["submitted", "validated", "queued", "admitted", "cluster.ready", "replicas.ready", "step 1", "checkpoint 10"],
        ["validated", "queued", "admitted", "cluster.ready", "replicas.ready", "step 1", "checkpoint 10", "step 40"],
        strict=True,
    ):
        assert names.index(earlier) < names.index(later), names
    assert names[-1] == "succeeded" and "phase:loop" in names
    assert marks[0]["since_start_s"] == 0 and marks[0]["since_prev_s"] is None
    total = sum(m["since_prev_s"] for m in marks[1:])
    assert total == pytest.approx(marks[-1]["since_start_s"], abs=0.01)
    assert marks[-1]["detail"] == "score 0.375"


def test_the_validation_report_names_every_check(api: httpx.Client) -> None:
    report = get(api, f"/api/runs/{REJECTED}/validation")
    assert report["verdict"] == "rejected"
    fatal = [c for c in report["checks"] if c["severity"] == "fatal"]
    assert fatal and all(c["message"] and c["fix"] for c in fatal)
    assert get(api, f"/api/runs/{TRAIN}/validation")["verdict"] == "validated"
    assert get(api, f"/api/runs/{INFER}/validation") == {"verdict": None, "checks": []}


def test_trials_filter_and_pass_rates(api: httpx.Client) -> None:
    assert get(api, f"/api/runs/{INFER}/trials")["total"] == 12
    say_yes = get(api, f"/api/runs/{INFER}/trials", task="say-yes")
    assert [t["trial"] for t in say_yes["trials"]] == [0, 1, 2, 3]
    assert get(api, f"/api/runs/{INFER}/trials", min_reward=1)["total"] == 7
    assert get(api, f"/api/runs/{INFER}/trials", max_reward=0)["total"] == 5
    assert get(api, f"/api/runs/{INFER}/trials", termination_reason="max_turns")["total"] == 0
    page = get(api, f"/api/runs/{TRAIN}/trials", limit=50, offset=300)
    assert (page["total"], len(page["trials"])) == (320, 20)
    rates = {t["task"]: t["pass_rate"] for t in get(api, f"/api/runs/{INFER}/tasks")["tasks"]}
    assert rates == {"count-files": 0.0, "say-yes": 0.75, "write-done": 1.0}
    across = get(api, "/api/tasks/pass-rates", run_ids=f"{INFER},{EVAL}")["tasks"]
    by_task = {t["task"]: t["runs"] for t in across}
    assert by_task["write-done"][EVAL]["pass_rate"] == 1.0 and by_task["say-no"][EVAL]["pass_rate"] == 0.5
    assert set(by_task["count-files"]) == {INFER, EVAL}


def test_a_trial_is_told_turn_by_turn_from_its_folder(api: httpx.Client) -> None:
    detail = get(api, f"/api/runs/{INFER}/trials/write-done/1")
    assert detail["found"] and detail["reward"] == 1.0
    first, second = detail["turns"]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][1]["content"] == "Write done into answer.txt."
    assert first["response"]["tool_calls"] == [{"name": "bash", "arguments": '{"command": "echo done > answer.txt"}'}]
    assert first["tool_results"] == [{"command": "echo done > answer.txt", "output": ""}]
    assert [m["role"] for m in second["messages"]] == ["tool"]  # the answer it follows is the first turn's
    assert second["response"]["content"] == "Done." and second["tool_results"] == []
    assert detail["verifier"]["reward.txt"].strip() == "1"
    assert "agent/terminal.jsonl" in detail["logs"]
    missing = get(api, f"/api/runs/{TRAIN}/trials/fake-task-0/0")
    assert missing["found"] is False and missing["turns"] == []


def test_usage_is_derived_per_team_and_run_and_counts_only_the_window_asked_for(
    api: httpx.Client, engine: Engine
) -> None:
    from tests.unit.test_usage import EVENTS, T0

    load(engine, EVENTS)
    body = get(api, "/api/usage")
    teams = {row.pop("team"): row for row in body["teams"]}
    assert teams["nlp"] == {
        "gpu_hours": {"rollout": 22.0, "training": 16.0, "eval": 0.0},
        "cpu_hours": 0.0,
        "sandbox_minutes": 40.0,
        "tokens_generated": 150,
    }
    assert teams["vision"]["cpu_hours"] == 2.0 and teams["vision"]["gpu_hours"]["eval"] > 1.0  # still running
    runs = {row["run_id"]: row for row in body["runs"]}
    assert runs["tr"]["run_type"] == "train" and runs["tr"]["gpu_hours"] == {"rollout": 16, "training": 16, "eval": 0}
    assert runs["inf"]["team"] == "nlp" and runs["cpu"]["run_type"] == "infer"
    late = get(api, "/api/usage", team="nlp", since=(T0 + timedelta(minutes=120)).isoformat())
    assert [row["team"] for row in late["teams"]] == ["nlp"] and {row["team"] for row in late["runs"]} == {"nlp"}
    assert late["teams"][0]["gpu_hours"] == {"rollout": 10.0, "training": 8.0, "eval": 0.0}
    assert late["teams"][0]["sandbox_minutes"] == 30.0 and late["teams"][0]["tokens_generated"] == 0
    assert get(api, "/api/usage", since="2026-12-01")["since"].startswith("2026-12-01T00:00:00")
    assert get(api, "/api/usage", team="nobody")["teams"] == []
    bad = api.get("/api/usage", params={"since": "last tuesday"})
    assert bad.status_code == 422 and "since" in bad.text


def test_every_route_needs_a_token_and_a_team_sees_only_its_own_runs(app: FastAPI, engine: Engine) -> None:
    from tests.unit.test_usage import EVENTS

    load(engine, EVENTS)  # runs of teams nlp and vision beside the recorded demo runs
    tried: list[str] = []
    refused: list[str] = []

    def check(client: TestClient, path: str, status: int, **params: Any) -> None:
        response = client.get(path, params=params)
        if status in (401, 404):
            tried.append(path)
            refused.extend([path] if response.status_code == status else [])
        assert response.status_code == status, (path, response.text)

    nobody = TestClient(app, base_url="http://tracker")
    forged = TestClient(app, base_url="http://tracker", headers=admin_headers("rct_nlp.forged"))
    run_paths = ["", "/config", "/events", "/timeline", "/validation", "/metrics", "/metrics/keys", "/checkpoints"]
    run_paths += ["/tasks", "/trials", "/trials/t/0"]
    for client in (nobody, forged):
        for path in ["/api/runs", "/api/usage", "/api/stream", "/metrics", "/api/session"]:
            check(client, path, 401)
        for path in run_paths:
            check(client, f"/api/runs/{TRAIN}{path}", 401)
    assert "Authorization: Bearer" in nobody.get("/api/runs").json()["detail"]
    assert nobody.get("/healthz").json() == {"ok": True}  # liveness needs no token, and tells nothing
    with TestClient(app, base_url="http://tracker", headers=admin_headers("rct_nlp.n1p")) as nlp:
        listed = nlp.get("/api/runs", params={"limit": 500}).json()
        assert sorted(run["run_id"] for run in listed["runs"]) == sorted([REJECTED, "inf", "tr"])  # nlp's only
        assert nlp.get("/api/runs", params={"team": "demo"}).json()["total"] == 0
        for path in run_paths:  # another team's run is a 404, as a missing run is: its id tells nothing
            check(nlp, f"/api/runs/{TRAIN}{path}", 404)
        check(nlp, "/api/tasks/pass-rates", 404, run_ids=f"inf,{TRAIN}")
        check(nlp, "/api/runs/inf", 200)
        assert {row["team"] for row in nlp.get("/api/usage").json()["teams"]} == {"nlp"}
        assert nlp.get("/api/usage", params={"team": "vision"}).json()["teams"] == []
        assert nlp.get("/metrics").status_code == 403
        assert nlp.get("/api/session").json() == {"team": "nlp", "admin": False}
    admin = TestClient(app, base_url="http://tracker", headers=admin_headers())
    assert admin.get("/api/runs", params={"limit": 500}).json()["total"] == 8 + 4
    assert admin.get(f"/api/runs/{TRAIN}").status_code == 200 and admin.get("/healthz").json()["events"] > 0
    # The dashboard's way: the token once, then a cookie for the browser session.
    browser = TestClient(app, base_url="http://tracker")
    assert browser.post("/api/session", json={"token": "rct_nlp.wrong"}).status_code == 401
    signed_in = browser.post("/api/session", json={"token": "rct_demo.d3m0"})
    assert signed_in.status_code == 200 and signed_in.json() == {"team": "demo", "admin": False}
    assert "httponly" in signed_in.headers["set-cookie"].lower()
    assert "samesite=strict" in signed_in.headers["set-cookie"].lower()
    assert browser.get(f"/api/runs/{TRAIN}").status_code == 200 and browser.get("/api/runs/inf").status_code == 404
    browser.delete("/api/session")
    assert browser.get(f"/api/runs/{TRAIN}").status_code == 401
    print(f"tracker: {len(refused)} of {len(tried)} cross-team or tokenless reads refused")


def test_a_runs_inline_events_are_bounded_and_the_rest_paged(
    api: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.tracker import api as routes

    every = get(api, f"/api/runs/{TRAIN}", events="true")["events"]
    assert len(every) > 5 and "events_truncated" not in get(api, f"/api/runs/{TRAIN}", events="true")
    monkeypatch.setattr(routes, "MAX_INLINE_EVENTS", 5)
    bounded = get(api, f"/api/runs/{TRAIN}", events="true")
    assert bounded["events"] == every[:5] and bounded["events_total"] == len(every)
    assert f"/api/runs/{TRAIN}/events?offset=5" in bounded["events_truncated"]
    rest = get(api, f"/api/runs/{TRAIN}/events", offset="5", limit="500")["events"]
    assert bounded["events"] + rest == every


def test_unknown_runs_are_a_404_that_says_how_to_find_one(api: httpx.Client) -> None:
    for path in ("/api/runs/nope", "/api/runs/nope/metrics", "/api/runs/nope/trials/a/0"):
        response = api.get(path)
        assert response.status_code == 404
        assert "no run 'nope'" in response.json()["detail"] and "/api/runs" in response.json()["detail"]


def test_the_openapi_description_is_published(api: httpx.Client) -> None:
    paths = get(api, "/openapi.json")["paths"]
    for path in (
        "/api/runs",
        "/api/runs/{run_id}/metrics",
        "/api/runs/{run_id}/trials/{task}/{trial}",
        "/api/stream",
        "/api/usage",
    ):
        assert path in paths
    assert "/" not in paths  # the dashboard's pages are not API


def test_the_dashboard_pages_are_served(api: httpx.Client) -> None:
    for path in ("/", f"/runs/{TRAIN}", f"/compare?runs={TRAIN},{INFER}", "/usage?team=demo"):
        response = api.get(path)
        assert response.status_code == 200 and "text/html" in response.headers["content-type"]
    assert api.get("/static/chart.js").status_code == 200


def test_recorded_stream_holds_what_this_file_expects() -> None:
    events = recorded()
    assert len({e.id for e in events}) == len(events)
    lines = (DATA / "stream.jsonl").read_text().splitlines()
    assert all(json.loads(line)["specversion"] == "1.0" for line in lines)


def test_the_tokens_of_any_window_are_those_of_the_trials_that_ended_in_it(engine: Engine) -> None:
    """Whole hours come from the hourly sums, the hours a window cuts through from their trials: every window gives
    what counting the trials one by one gives."""
    template = next(e for e in recorded() if e.name == "trial.finished")
    base = datetime(2026, 12, 1, 9, 50, tzinfo=UTC)
    times = [base + timedelta(minutes=7 * i) for i in range(40)]  # across five hours
    events = [
        template.model_copy(
            update={
                "id": f"tok-{i}",
                "runid": "tok-run",
                "time": at,
                "data": template.data.model_copy(update={"trial": i, "tokens": {"prompt": 1, "completion": i + 1}}),
            }
        )
        for i, at in enumerate(times)
    ]
    load(engine, events)
    marks = [base + timedelta(minutes=m) for m in (0, 3, 10, 11, 69, 70, 71, 130, 190, 250, 273, 300)]
    with Session(engine) as session:
        for since in [None, *marks]:
            for now in marks + [base + timedelta(days=1)]:
                if since is not None and since > now:
                    continue
                counted = sum(i + 1 for i, at in enumerate(times) if (since is None or at >= since) and at <= now)
                got = queries.tokens_by_run(session, None, since, now).get("tok-run", ("", 0))[1]
                assert got == counted, (since, now)
        assert queries.tokens_by_run(session, "nobody", None, marks[-1]) == {}
        assert queries.tokens_by_run(session, template.team, None, marks[-1])["tok-run"][0] == template.team
