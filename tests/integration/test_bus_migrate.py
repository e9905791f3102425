"""A bus made by an earlier runctl (every team's events in one RUNS and one TRIALS stream) moved to per-team streams
against a real nats-server: every event copied in order into its team's stream, each durable consumer carried over
from where it had got to, the shared streams gone, and a second run a no-op."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nats.js import api

from runctl.bus import Bus, ConsumerSpec, Delivery
from runctl.bus.migrate import migrate_shared_streams
from runctl.events import StepDone, TrialFinished, new_event
from runctl.events.payloads import PAYLOADS, RUNS_STREAM, TRIALS_STREAM
from runctl.subjects import event_filter, team_stream
from tests.conftest import NatsServer, async_wait_until

pytestmark = pytest.mark.integration


def step(team: str, n: int) -> object:
    return new_event(StepDone(step=n, metrics={}), team=team, run_id=f"{team}-run", source="/t")


async def shared_bus(bus: Bus) -> None:
    """The streams and the launcher's consumer as an earlier runctl made them, the consumer 4 events in."""
    for family in (RUNS_STREAM, TRIALS_STREAM):
        subjects = [event_filter(p.event_name) for p in PAYLOADS if p.stream == family]
        await bus.js.add_stream(api.StreamConfig(name=family, subjects=subjects, storage=api.StorageType.FILE))
    events = [step("nlp" if n % 3 else "vision", n) for n in range(9)]
    for event in events:
        await bus.js.publish(event.nats_subject, event.to_json(), headers={"Nats-Msg-Id": event.id})  # type: ignore[attr-defined]
    finished = TrialFinished(task="t", trial=0, reward=1.0, termination_reason="agent_completed")
    trial = new_event(finished, team="vision", run_id="vision-run", source="/t")
    await bus.js.publish(trial.nats_subject, trial.to_json(), headers={"Nats-Msg-Id": trial.id})
    config = api.ConsumerConfig(
        durable_name="launcher", ack_policy=api.AckPolicy.EXPLICIT, filter_subject=event_filter("step.done")
    )
    await bus.js.add_consumer(RUNS_STREAM, config)
    sub = await bus.js.pull_subscribe_bind("launcher", RUNS_STREAM)
    for msg in await sub.fetch(4, timeout=5):
        await msg.ack_sync()
    await sub.unsubscribe()


async def test_the_shared_streams_move_into_per_team_streams_with_their_consumers(bus: Bus) -> None:
    await shared_bus(bus)
    done = await migrate_shared_streams(bus)
    assert done.copied == {RUNS_STREAM: 9, TRIALS_STREAM: 1}
    names = set(await bus.stream_names())
    assert not {RUNS_STREAM, TRIALS_STREAM} & names
    steps = {}
    for team in ("nlp", "vision"):
        info = await bus.js.stream_info(team_stream(RUNS_STREAM, team))
        got = [await bus.js.get_msg(info.config.name, seq) for seq in range(1, info.state.last_seq + 1)]  # type: ignore[arg-type]
        steps[team] = [int(msg.data.split(b'"step":', 1)[1].split(b",", 1)[0]) for msg in got if msg.data]
    assert steps == {"nlp": [1, 2, 4, 5, 7, 8], "vision": [0, 3, 6]}  # each team's in their order
    assert (await bus.js.stream_info(team_stream(TRIALS_STREAM, "vision"))).state.messages == 1

    # The launcher handled steps 0-3 on the shared stream: it resumes with 4 and never sees 0-3 again.
    seen: list[int] = []

    async def handler(batch: list[Delivery]) -> None:
        seen.extend(d.event.data.step for d in batch)  # type: ignore[attr-defined]

    await bus.ensure_streams(teams=["nlp", "vision"])
    spec = ConsumerSpec(durable="launcher", stream=RUNS_STREAM, filter_subjects=[event_filter("step.done")])
    group = await bus.consumer(spec)
    task = asyncio.create_task(group.run(handler, fetch_timeout_s=0.2))
    try:
        await async_wait_until(lambda: len(seen) >= 5, 15, "the five steps the launcher had not handled")
        await bus.publish(step("nlp", 9))  # type: ignore[arg-type]
        await async_wait_until(lambda: 9 in seen, 15, "a step published after the move")
    finally:
        group.stop()
        await task
        await group.close()
    assert sorted(seen) == [4, 5, 6, 7, 8, 9]
    assert not await migrate_shared_streams(bus)  # nothing left to move


def test_runctl_bus_migrate_moves_a_shared_bus_and_then_has_nothing_to_do(nats_server: NatsServer) -> None:
    async def prepare() -> None:
        bus = await Bus.connect(nats_server.url)
        try:
            await shared_bus(bus)
        finally:
            await bus.close()

    asyncio.run(prepare())
    env = {**os.environ, "RUNCTL_NATS_URL": nats_server.url}
    env.pop("RUNCTL_TOKEN", None)
    runctl = [str(Path(sys.executable).parent / "runctl"), "bus", "migrate"]
    moved = subprocess.run(runctl, env=env, capture_output=True, text=True, timeout=60)
    assert moved.returncode == 0, moved.stderr
    assert "moved 9 events of the shared RUNS stream" in moved.stdout and "launcher" in moved.stdout
    again = subprocess.run(runctl, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "nothing to move" in again.stdout
