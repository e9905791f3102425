"""Attacks on the tracker's record by another team's events that carry a victim's event ids (a copied or guessed id,
on the attacker's own subjects, naming the victim's run or its own): on SQLite and PostgreSQL, the victim's run
is recorded exactly as without them — every event, trial, metric and its state."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from runctl.events import Event
from services.tracker import queries
from services.tracker.db import EventRow, RunRow, TrialRow, make_engine
from tests.integration.test_tracker_api import INFER, TRAIN, db_url, load, recorded  # noqa: F401  (a fixture)

pytestmark = pytest.mark.integration

ATTACKER = "intruder"


@pytest.fixture
def engines(db_url: str, tmp_path: Any) -> Iterator[tuple[Engine, Engine]]:  # noqa: F811
    """The database under attack, and a clean SQLite one that records the same events without the attack."""
    attacked, clean = make_engine(db_url), make_engine(f"sqlite:///{tmp_path / 'clean.db'}")
    yield attacked, clean
    attacked.dispose()
    clean.dispose()


def record_of(engine: Engine, run_id: str) -> dict[str, Any]:
    with Session(engine) as session:
        run = session.get(RunRow, run_id)
        assert run is not None
        events = session.scalars(select(EventRow).where(EventRow.run_id == run_id, EventRow.team == run.team))
        trials = session.scalars(select(TrialRow.event_id).where(TrialRow.run_id == run_id))
        return {
            "run": (run.team, run.state, run.num_events, run.num_trials, run.last_step, run.score),
            "events": sorted((e.id, e.name, json.dumps(e.data, sort_keys=True)) for e in events),
            "trials": sorted(trials),
            "tasks": queries.task_rates(session, run_id),
            "metrics": queries.metric_keys(session, run_id),
        }


def forged(victims: list[Event], run_id: str | None) -> list[Event]:
    """The victim's events as the attacker sends them first: its own team, the victim's ids, and the victim's run id
    (``run_id`` None) or a run of its own."""
    return [e.model_copy(update={"team": ATTACKER, "runid": run_id or e.runid}) for e in victims]


@pytest.mark.parametrize("victim", [INFER, TRAIN])
@pytest.mark.parametrize("where", ["the victim's run id", "a run of its own"])
def test_another_teams_events_with_the_victims_ids_shadow_nothing(
    engines: tuple[Engine, Engine], victim: str, where: str
) -> None:
    attacked, clean = engines
    events = [e for e in recorded() if e.runid == victim]
    load(clean, events)
    own_run = None if where == "the victim's run id" else f"{ATTACKER}-run"
    # The forgeries arrive after the victim's submission (a run id is random: nothing of it is known before) and
    # before the rest of its events.
    load(attacked, events[:1] + forged(events[1:], own_run) + events[1:])
    assert record_of(attacked, victim) == record_of(clean, victim)
