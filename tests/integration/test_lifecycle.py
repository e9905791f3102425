"""A run's whole life through the real services (validator, launcher, tracker) over a real nats-server."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from runctl.bus import Bus
from runctl.config import load_config
from runctl.events import ConfigSubmitted, new_event
from runctl.events.payloads import RUNS_STREAM
from runctl.sdk import RunctlClient, submission_event
from runctl.subjects import team_stream
from tests.conftest import ROOT, Services, admin_headers, wait_until

pytestmark = pytest.mark.integration

TRAIN_PHASES = ["validate", "environment", "ray", "replicas", "proxy", "loop", "outputs"]


def fake_config(tmp_path: Path, **overrides: str) -> Path:
    values = {
        "RUN_TYPE": "train",
        "TEAM": "nlp",
        "ENGINE": "fake",
        "PROJECT_NAME": "p",
        "EXP_NAME": "life",
        "MODEL_PATH": "synthetic://m",
        "TRAIN_FILES": "synthetic://d",
        "NGPUS_PER_NODE": "0",
        "GEN_TP": "1",
        "N_RESP": "2",
        "SAVE_FREQ": "2",
        "FAKE_NUM_STEPS": "3",
        "FAKE_STEP_DELAY_SEC": "0",
        **overrides,
    }
    path = tmp_path / "run.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def expected_names(num_steps: int, n_resp: int, save_freq: int) -> list[str]:
    names = ["config.submitted", "config.validated", "run.queued", "run.admitted"]
    names += ["phase.started"] * 3 + ["cluster.ready", "phase.started", "replicas.ready"]
    names += ["phase.started", "phase.started"]
    for step in range(1, num_steps + 1):
        names += ["trial.finished"] * (4 * min(n_resp, 2)) + ["step.done"]
        if step % save_freq == 0 or step == num_steps:
            names.append("checkpoint.saved")
    return [*names, "phase.started", "run.succeeded"]


def tracked(services: Services, run_id: str) -> dict[str, Any] | None:
    response = httpx.get(f"{services.tracker_url}/api/runs/{run_id}?events=true", headers=admin_headers(), timeout=5)
    return response.json() if response.status_code == 200 else None


def wait_for_state(services: Services, run_id: str, state: str, timeout_s: float = 60) -> dict[str, Any]:
    record: dict[str, Any] = {}

    def reached() -> bool:
        nonlocal record
        found = tracked(services, run_id)
        record = found or {}
        return bool(found and found["run"]["state"] == state)

    wait_until(reached, timeout_s, f"run {run_id} to be {state} (last: {record.get('run', {}).get('state')})")
    return record


def wait_for_run(services: Services, run_id: str, state: str, count: int, timeout_s: float = 90) -> dict[str, Any]:
    """The run's record once it reached ``state`` and holds ``count`` events: RUNS and TRIALS are consumed
    separately, so a run's end may be recorded a moment before its last trials."""
    wait_for_state(services, run_id, state, timeout_s)
    record = wait_for_events(services, run_id, count, timeout_s)
    ids = [e["id"] for e in record["events"]]
    assert len(ids) == len(set(ids)) == count, f"{len(ids)} events, {len(set(ids))} distinct, {count} expected"
    return record


def wait_for_events(services: Services, run_id: str, count: int, timeout_s: float = 60) -> dict[str, Any]:
    record: dict[str, Any] = {}

    def enough() -> bool:
        nonlocal record
        record = tracked(services, run_id) or {}
        return len(record.get("events", [])) >= count

    wait_until(enough, timeout_s, f"{count} events of {run_id} (have {len(record.get('events', []))})")
    return record


def submit(services: Services, config: Path) -> str:
    async def go() -> str:
        async with RunctlClient(services.nats_url, services.tracker_url) as client:
            return (await client.submit(config)).run_id

    return asyncio.run(go())


def start_core(services: Services) -> None:
    for name in ("validator", "launcher", "tracker"):
        services.start(name)


def test_submit_carries_a_run_through_every_event_once_and_in_order(services: Services, tmp_path: Path) -> None:
    start_core(services)
    run_id = submit(services, fake_config(tmp_path))
    expected = expected_names(num_steps=3, n_resp=2, save_freq=2)
    record = wait_for_run(services, run_id, "succeeded", len(expected))
    names = [e["name"] for e in record["events"]]
    assert names == expected
    assert len({e["id"] for e in record["events"]}) == len(names)
    phases = [e["data"]["phase"] for e in record["events"] if e["name"] == "phase.started"]
    assert phases == TRAIN_PHASES
    run = record["run"]
    assert (run["team"], run["run_type"], run["engine"], run["last_step"], run["num_trials"]) == (
        "nlp",
        "train",
        "fake",
        3,
        24,
    )
    assert run["synthetic"] is True
    assert run["score"] == pytest.approx(3 / 8)
    assert record["resolved"]["ENGINE"] == {"value": "fake", "layer": "run", "source": f"{tmp_path}/run.env:3"}
    steps = [e["data"]["step"] for e in record["events"] if e["name"] == "step.done"]
    assert steps == [1, 2, 3]
    assert all(e["data"]["synthetic"] for e in record["events"] if e["name"] in ("step.done", "trial.finished"))


def test_the_same_event_published_twice_is_stored_once(services: Services, tmp_path: Path) -> None:
    services.start("tracker")
    resolved = load_config(fake_config(tmp_path), environ={})
    event = submission_event(resolved)

    async def publish_twice_with_a_pause() -> None:
        bus = await Bus.connect(services.nats_url)
        try:
            await bus.publish(event)
            await bus.publish(event)
            # Outside JetStream's duplicate window the stream takes it again; the tracker must still not.
            await bus.js.publish(event.nats_subject, event.to_json())
        finally:
            await bus.close()

    asyncio.run(publish_twice_with_a_pause())

    async def stream_count() -> int:
        bus = await Bus.connect(services.nats_url)
        try:
            return int((await bus.js.stream_info(team_stream(RUNS_STREAM, event.team))).state.messages)
        finally:
            await bus.close()

    assert asyncio.run(stream_count()) == 2
    record = wait_for_events(services, event.runid, 1)
    health = services.procs["tracker"]
    wait_until(lambda: _handled(services, "tracker-runs") >= 2, 20, "the tracker to consume both copies")
    record = tracked(services, event.runid)
    assert record is not None
    assert [e["name"] for e in record["events"]] == ["config.submitted"]
    assert record["run"]["num_events"] == 1
    assert health.poll() is None


def _handled(services: Services, consumer: str) -> int:
    from runctl.subjects import health_subject

    async def ask() -> int:
        bus = await Bus.connect(services.nats_url)
        try:
            reply = await bus.nc.request(health_subject("tracker"), b"", timeout=2)
            return int(json.loads(reply.data)["consumers"][consumer]["handled"])
        finally:
            await bus.close()

    return asyncio.run(ask())


def test_a_bad_config_is_rejected_by_the_validator_service(services: Services, tmp_path: Path) -> None:
    start_core(services)
    resolved = load_config(fake_config(tmp_path), environ={})
    good = submission_event(resolved)
    payload = good.data
    assert isinstance(payload, ConfigSubmitted)
    resolved_rows = dict(payload.resolved)
    resolved_rows["GEN_TP"] = {"value": "zero", "layer": "run", "source": "x:1"}
    resolved_rows["BOGUS_KEY"] = {"value": "1", "layer": "run", "source": "x:2"}
    bad = new_event(
        payload.model_copy(update={"resolved": resolved_rows}), team="nlp", run_id=good.runid, source="/test"
    )

    async def publish() -> None:
        bus = await Bus.connect(services.nats_url)
        try:
            await bus.publish(bad)
        finally:
            await bus.close()

    asyncio.run(publish())
    record = wait_for_state(services, bad.runid, "rejected")
    rejected = record["events"][-1]
    assert rejected["name"] == "config.rejected"
    codes = {c["id"] for c in rejected["data"]["checks"]}
    assert codes == {"schema.value", "schema.unknown_key"}
    assert record["run"]["error"]["error_type"] == "ConfigRejected"
    assert "run.admitted" not in [e["name"] for e in record["events"]]


def test_a_train_run_asking_what_the_local_trainer_cannot_do_is_rejected_before_it_starts(
    services: Services, tmp_path: Path
) -> None:
    start_core(services)
    data = ROOT / "tests" / "data"
    config = fake_config(
        tmp_path,
        ENGINE="local",
        MODEL_PATH=str(data / "models" / "llama-tiny"),
        TRAIN_FILES=str(data / "tasks"),
        MAX_PROMPT="256",
        MAX_RESP="256",
        TRAINING_MODE="async",
    )
    config.write_text("".join(line + "\n" for line in config.read_text().splitlines() if not line.startswith("FAKE_")))
    run_id = submit(services, config)
    record = wait_for_state(services, run_id, "rejected")
    fatal = [c for c in record["run"]["error"]["checks"] if c["severity"] == "fatal"]
    refused = next(c for c in fatal if c["id"] == "engine.not_built")
    assert "TRAINING_MODE=async" in refused["message"], fatal
    assert "the fully async mode is verl's" in refused["message"] and "TRAINING_MODE=sync" in refused["fix"]
    assert "run.admitted" not in [e["name"] for e in record["events"]]


def test_an_engine_failure_names_its_phase(services: Services, tmp_path: Path) -> None:
    start_core(services)
    run_id = submit(services, fake_config(tmp_path, FAKE_FAIL_AT="replicas"))
    record = wait_for_state(services, run_id, "failed")
    assert record["run"]["error"]["phase"] == "replicas"
    assert "replicas.ready" not in [e["name"] for e in record["events"]]


def test_cancel_stops_a_running_run(services: Services, tmp_path: Path) -> None:
    start_core(services)
    run_id = submit(services, fake_config(tmp_path, FAKE_NUM_STEPS="200", FAKE_STEP_DELAY_SEC="0.02"))
    wait_for_state(services, run_id, "running")

    async def cancel() -> None:
        async with RunctlClient(services.nats_url, services.tracker_url) as client:
            await client.cancel(run_id, reason="test")

    asyncio.run(cancel())
    record = wait_for_state(services, run_id, "cancelled")
    names = [e["name"] for e in record["events"]]
    assert "cancel.requested" in names and names[-1] == "run.cancelled"
    assert "run.succeeded" not in names


@pytest.mark.parametrize("victim", ["tracker", "launcher", "validator"])
def test_a_service_killed_mid_run_catches_up_and_nothing_is_lost_or_doubled(
    services: Services, tmp_path: Path, victim: str
) -> None:
    start_core(services)
    config = fake_config(tmp_path, FAKE_NUM_STEPS="6", FAKE_STEP_DELAY_SEC="0.05")
    run_id = submit(services, config)
    wait_for_events(services, run_id, 20)
    services.kill(victim)
    if victim == "validator":
        # While it is down, a second run is submitted: it waits on the bus for the restarted validator.
        second = submit(services, config)
    services.start(victim)
    expected = expected_names(num_steps=6, n_resp=2, save_freq=2)
    record = wait_for_run(services, run_id, "succeeded", len(expected))
    assert sorted(e["name"] for e in record["events"]) == sorted(expected)
    assert record["run"]["num_trials"] == 6 * 8
    if victim == "validator":
        record = wait_for_run(services, second, "succeeded", len(expected))
        assert sorted(e["name"] for e in record["events"]) == sorted(expected)


def test_services_shut_down_gracefully_on_sigterm(services: Services) -> None:
    start_core(services)
    for name in ("validator", "launcher", "tracker"):
        assert services.stop(name) == 0, services.log(name)[-2000:]
        assert services.log(name).rstrip().endswith("INFO stopped")


def test_a_launcher_stopped_gracefully_mid_run_hands_the_run_to_the_next_one(
    services: Services, tmp_path: Path
) -> None:
    start_core(services)
    run_id = submit(services, fake_config(tmp_path, FAKE_NUM_STEPS="6", FAKE_STEP_DELAY_SEC="0.05"))
    wait_for_events(services, run_id, 20)
    assert services.stop("launcher") == 0
    services.start("launcher")
    record = wait_for_run(services, run_id, "succeeded", len(expected_names(num_steps=6, n_resp=2, save_freq=2)))
    assert [e["name"] for e in record["events"]].count("run.succeeded") == 1


def test_another_team_can_neither_cancel_nor_fail_a_run(services: Services, tmp_path: Path) -> None:
    from runctl.events import CancelRequested, RunFailed

    start_core(services)
    run_id = submit(services, fake_config(tmp_path, FAKE_NUM_STEPS="8", FAKE_STEP_DELAY_SEC="0.05"))
    wait_for_events(services, run_id, 10)

    async def interfere() -> None:
        bus = await Bus.connect(services.nats_url)
        try:
            await bus.publish(
                new_event(CancelRequested(requested_by="mallory"), team="vision", run_id=run_id, source="/x")
            )
            failed = RunFailed(phase="loop", error_type="Forged", message="not really")
            await bus.publish(new_event(failed, team="vision", run_id=run_id, source="/x"))
        finally:
            await bus.close()

    asyncio.run(interfere())
    record = wait_for_state(services, run_id, "succeeded", timeout_s=90)
    assert record["run"]["error"] is None
    assert record["run"]["team"] == "nlp"


def test_a_run_survives_a_bus_outage(services: Services, nats_server: Any, tmp_path: Path) -> None:
    from tests.conftest import _start_nats, _stop

    start_core(services)
    run_id = submit(services, fake_config(tmp_path, FAKE_NUM_STEPS="6", FAKE_STEP_DELAY_SEC="0.05"))
    wait_for_events(services, run_id, 20)
    _stop(nats_server.proc)
    time.sleep(3)  # the outage itself: nothing to wait for, the bus is simply gone for a while
    nats_server.proc = _start_nats(nats_server.port, nats_server.store)
    wait_for_run(services, run_id, "succeeded", len(expected_names(num_steps=6, n_resp=2, save_freq=2)), 120)
    assert all(services.procs[name].poll() is None for name in ("validator", "launcher", "tracker"))


def test_the_validator_service_runs_the_static_checks_and_rejects_a_fatal_one(
    services: Services, tmp_path: Path
) -> None:
    start_core(services)
    run_id = submit(services, fake_config(tmp_path, ENGINE="local", MODEL_PATH="/nonexistent/runctl/model"))
    record = wait_for_state(services, run_id, "rejected")
    checks = record["events"][-1]["data"]["checks"]
    fatal = {c["id"] for c in checks if c["severity"] == "fatal"}
    assert "paths.model" in fatal
    assert {c["check_class"] for c in checks} >= {1, 2, 3, 4, 5, 6, 7, 8, 9}


def test_the_launcher_validates_again_just_before_launch(services: Services, tmp_path: Path) -> None:
    data = ROOT / "tests" / "data"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((data / "models" / "llama-tiny" / "config.json").read_text())
    config = tmp_path / "eval.env"
    values = {"RUN_TYPE": "eval", "TEAM": "nlp", "PROJECT_NAME": "p", "EXP_NAME": "again", "NGPUS_PER_NODE": "0"}
    values |= {"GEN_TP": "1", "MODEL_PATH": str(model), "DATASET_PATH": str(data / "tasks"), "AGENT_NAME": "oracle"}
    config.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    resolved = load_config(config, environ={})  # valid now: the model folder exists
    services.start("validator")
    services.start("tracker")

    async def submit_then_remove_the_model() -> str:
        async with RunctlClient(services.nats_url, services.tracker_url) as client:
            return (await client.submit(resolved)).run_id

    run_id = asyncio.run(submit_then_remove_the_model())
    wait_for_state(services, run_id, "validated")
    (model / "config.json").unlink()
    model.rmdir()
    services.start("launcher")
    record = wait_for_state(services, run_id, "failed")
    # The launcher runs the validator's checks itself before it admits a run (it takes no config.validated on
    # trust), so the missing model is found at admission; the runner checks once more just before it launches.
    assert record["run"]["error"]["phase"] == "admission"
    assert "paths.model" in record["run"]["error"]["message"]
