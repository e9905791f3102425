from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from runctl.errors import EventError
from runctl.events import (
    BY_NAME,
    PAYLOADS,
    CheckpointSaved,
    RunFailed,
    SandboxCreated,
    SandboxDestroyed,
    StepDone,
    TrialFinished,
    new_event,
    parse_event,
)
from runctl.events.payloads import RUNS_STREAM, TRIALS_STREAM
from runctl.subjects import event_subject, parse_event_subject, run_filter, team_filter


def test_envelope_is_cloudevents_1_0_with_team_and_runid_extensions() -> None:
    event = new_event(StepDone(step=3, metrics={"actor/ppo_kl": 0.01}), team="nlp", run_id="r-1", source="/runctl/x")
    doc = json.loads(event.to_json())
    assert doc["specversion"] == "1.0"
    assert doc["type"] == "runctl.step.done.v1"
    assert doc["datacontenttype"] == "application/json"
    assert (doc["subject"], doc["runid"], doc["team"]) == ("r-1", "r-1", "nlp")
    assert doc["data"] == {"step": 3, "metrics": {"actor/ppo_kl": 0.01}, "synthetic": False}
    assert datetime.fromisoformat(doc["time"]).tzinfo is not None


def test_every_payload_round_trips_through_the_one_parser() -> None:
    samples = {
        "checkpoint.saved": CheckpointSaved(step=10, path="/c/global_step_10", format="fsdp", num_bytes=123),
        "trial.finished": TrialFinished(task="t", trial=0, reward=None, termination_reason="timeout"),
        "run.failed": RunFailed(phase="replicas", error_type="Timeout", message="no replica"),
    }
    for name, payload in samples.items():
        event = new_event(payload, team="nlp", run_id="r-1", source="/t", time=datetime(2026, 1, 1, tzinfo=UTC))
        parsed = parse_event(event.to_json())
        assert parsed == event
        assert parsed.name == name
        assert type(parsed.data) is BY_NAME[name]


def test_type_strings_are_versioned_and_unique() -> None:
    types = [p.type_string() for p in PAYLOADS]
    assert len(types) == len(set(types))
    assert all(t.startswith("runctl.") and t.endswith(".v1") for t in types)


def test_high_volume_events_go_to_their_own_stream() -> None:
    per_trial = {TrialFinished, SandboxCreated, SandboxDestroyed}
    assert {p.stream for p in per_trial} == {TRIALS_STREAM}
    assert {p.stream for p in PAYLOADS if p not in per_trial} == {RUNS_STREAM}


def test_payloads_are_frozen_and_refuse_unknown_fields() -> None:
    step = StepDone(step=1, metrics={})
    with pytest.raises(ValidationError):
        step.step = 2  # type: ignore[misc]
    with pytest.raises(ValidationError):
        StepDone(step=1, metrics={}, extra_field=1)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1, 2]",
        b'{"type": "runctl.nope.v1"}',
        b'{"type": "runctl.step.done.v1", "data": {"step": -1, "metrics": {}}}',
        b'{"specversion": "1.0", "type": "runctl.step.done.v1", "data": {"step": 1, "metrics": {}}}',
        b"\xff\xfe",
    ],
)
def test_bad_messages_raise_event_error(raw: bytes) -> None:
    with pytest.raises(EventError):
        parse_event(raw)


def test_event_ids_are_random_unless_given() -> None:
    a = new_event(StepDone(step=1, metrics={}), team="t", run_id="r", source="/s")
    b = new_event(StepDone(step=1, metrics={}), team="t", run_id="r", source="/s")
    assert a.id != b.id
    c = new_event(StepDone(step=1, metrics={}), team="t", run_id="r", source="/s", event_id="r.step.1")
    assert c.id == "r.step.1"


def test_subjects_are_built_in_one_place_and_parse_back() -> None:
    subject = event_subject("nlp", "swe-grpo-20261130-1a2b", "checkpoint.saved")
    assert subject == "runctl.nlp.swe-grpo-20261130-1a2b.checkpoint.saved"
    assert parse_event_subject(subject) == ("nlp", "swe-grpo-20261130-1a2b", "checkpoint.saved")
    assert run_filter("r-1") == "runctl.*.r-1.>"
    assert team_filter("nlp") == "runctl.nlp.>"


@pytest.mark.parametrize("bad", ["a.b", "a b", "*", ">", ""])
def test_subject_tokens_refuse_dots_spaces_and_wildcards(bad: str) -> None:
    with pytest.raises(EventError):
        event_subject(bad, "run", "step.done")
    with pytest.raises(EventError):
        event_subject("team", bad, "step.done")


def test_parse_event_subject_refuses_foreign_subjects() -> None:
    with pytest.raises(EventError):
        parse_event_subject("other.nlp.r.step.done")


def test_non_finite_numbers_travel_as_strings_and_parse_back() -> None:
    import math

    event = new_event(
        StepDone(step=1, metrics={"loss": float("nan"), "kl": float("inf")}), team="t", run_id="r", source="/s"
    )
    raw = event.to_json()
    assert b'"NaN"' in raw and b'"Infinity"' in raw
    json.loads(raw)  # plain JSON, no bare NaN tokens
    parsed = parse_event(raw)
    assert isinstance(parsed.data, StepDone)
    assert math.isnan(parsed.data.metrics["loss"]) and parsed.data.metrics["kl"] == math.inf


def test_a_trailing_newline_is_not_a_valid_subject_token() -> None:
    with pytest.raises(EventError):
        event_subject("demo", "abc\n", "cancel.requested")
