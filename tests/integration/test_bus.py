"""The bus against a real nats-server: streams, de-duplication, consumers, dead letters."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest

from runctl.bus import Bus, Consumer, ConsumerSpec, Delivery, StreamLimits
from runctl.bus.client import BatchHandler, TeamConsumers
from runctl.errors import BusUnreachableError, PublishError
from runctl.events import StepDone, TrialFinished, new_event
from runctl.events.payloads import RUNS_STREAM, TRIALS_STREAM
from runctl.subjects import DEADLETTER_STREAM, deadletter_subject, event_filter, event_subject, team_stream
from tests.conftest import NatsServer, async_wait_until, free_port

pytestmark = pytest.mark.integration

NLP_RUNS, NLP_TRIALS = team_stream(RUNS_STREAM, "nlp"), team_stream(TRIALS_STREAM, "nlp")


def step(n: int, run_id: str = "r-1", event_id: str | None = None):  # type: ignore[no-untyped-def]
    return new_event(
        StepDone(step=n, metrics={"x": float(n)}), team="nlp", run_id=run_id, source="/t", event_id=event_id
    )


async def consume_until(
    bus: Bus, spec: ConsumerSpec, handler: BatchHandler, condition: Callable[[], object], what: str
) -> Consumer | TeamConsumers:
    """Run a consumer until ``condition`` holds (or fail the test naming ``what``), then stop and close it, as a
    service does: a pull request of a stopped reader that is still open at the server would otherwise take the next
    messages published, and they would come again only after the consumer's ack wait (30 s)."""
    consumer = await bus.consumer(spec)
    task = asyncio.create_task(consumer.run(handler, fetch_timeout_s=0.2))
    try:
        await async_wait_until(condition, 15, what)
    finally:
        consumer.stop()
        await task
        await consumer.close()
    return consumer


def dead_lettered(bus: Bus, count: int = 1) -> Callable[[], Awaitable[bool]]:
    async def parked() -> bool:
        return (await bus.js.stream_info(DEADLETTER_STREAM)).state.messages == count

    return parked


async def test_streams_are_created_idempotently_and_updated_when_limits_change(bus: Bus) -> None:
    await bus.ensure_streams(teams=["nlp"])
    await asyncio.gather(bus.ensure_streams(teams=["nlp"]), bus.ensure_streams(teams=["nlp", "vision"]))
    names = {info.config.name for info in await bus.js.streams_info()}
    assert {NLP_RUNS, NLP_TRIALS, team_stream(TRIALS_STREAM, "vision"), DEADLETTER_STREAM} <= names
    assert not {RUNS_STREAM, TRIALS_STREAM} & names  # no stream shared by teams
    trials = await bus.js.stream_info(NLP_TRIALS)
    names = ("trial.finished", "sandbox.created", "sandbox.destroyed")
    assert sorted(trials.config.subjects or []) == sorted(event_filter(name, team="nlp") for name in names)
    await bus.ensure_streams(StreamLimits(trials_max_age_s=3600.0), teams=["nlp"])
    assert (await bus.js.stream_info(NLP_TRIALS)).config.max_age == 3600.0


async def test_a_privileged_publish_makes_its_teams_streams_first(nats_server: NatsServer) -> None:
    bare = await Bus.connect(nats_server.url)
    try:
        assert (await bare.publish(step(1))).stream == NLP_RUNS
        assert (await bare.publish_many([step(2, run_id="r-2")]))[0].stream == NLP_RUNS
        assert await bare.team_of_run("r-2") == "nlp" and await bare.team_of_run("r-3") is None
    finally:
        await bare.close()


async def test_events_land_in_their_stream_on_their_subject(bus: Bus) -> None:
    ack = await bus.publish(step(1))
    assert ack.stream == NLP_RUNS
    trial = new_event(
        TrialFinished(task="t", trial=0, reward=1.0, termination_reason="agent_completed"),
        team="nlp",
        run_id="r-1",
        source="/t",
    )
    assert (await bus.publish(trial)).stream == NLP_TRIALS
    msg = await bus.js.get_last_msg(NLP_RUNS, event_subject("nlp", "r-1", "step.done"))
    assert msg.headers is not None and msg.headers["Nats-Msg-Id"] == (await _first_id(bus))


async def _first_id(bus: Bus) -> str:
    msg = await bus.js.get_msg(NLP_RUNS, 1)
    import json

    return str(json.loads(msg.data)["id"])


async def test_the_same_event_published_twice_is_stored_once(bus: Bus) -> None:
    event = step(1)
    first = await bus.publish(event)
    again = await bus.publish(event)
    assert again.duplicate is True and again.seq == first.seq
    assert (await bus.js.stream_info(NLP_RUNS)).state.messages == 1


async def test_publish_many_pipelines_and_dedupes(bus: Bus) -> None:
    events = [step(i) for i in range(500)]
    acks = await bus.publish_many(events + events[:100])
    assert len(acks) == 600
    assert sum(1 for a in acks if a.duplicate) == 100
    assert (await bus.js.stream_info(NLP_RUNS)).state.messages == 500


async def test_unreachable_bus_names_the_fix() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    with pytest.raises(BusUnreachableError) as info:
        await Bus.connect(url)
    assert url in info.value.message and "runctl up" in info.value.message and "RUNCTL_NATS_URL" in info.value.message


async def test_consumer_delivers_in_order_and_resumes_where_it_left_off(bus: Bus) -> None:
    spec = ConsumerSpec(durable="t-order", stream=RUNS_STREAM, filter_subjects=[event_filter("step.done")], batch=7)
    await bus.publish_many([step(i) for i in range(20)])
    seen: list[int] = []

    async def handler(batch: list[Delivery]) -> None:
        seen.extend(d.event.data.step for d in batch)  # type: ignore[attr-defined]

    await consume_until(bus, spec, handler, lambda: len(seen) == 20, "20 deliveries")
    assert seen == list(range(20))
    await bus.publish_many([step(i) for i in range(20, 25)])
    await consume_until(bus, spec, handler, lambda: len(seen) == 25, "5 more deliveries")
    assert seen == list(range(25))


async def test_a_closed_readers_open_pull_request_takes_nothing_from_the_next_reader(bus: Bus) -> None:
    # A reader stopped while its pull request is still open at the server (the request outlives the client's wait
    # on a loaded machine): once closed, the server drops the request, and the next reader gets the next message at
    # once rather than after the consumer's ack wait (30 s).
    spec = ConsumerSpec(durable="t-closed", stream=NLP_RUNS, filter_subjects=[event_filter("step.done")])
    await bus.ensure_streams(teams=["nlp"])
    first = await bus.consumer(spec)
    assert isinstance(first, Consumer)
    waiting = asyncio.create_task(first.sub.fetch(1, timeout=20))

    async def request_open() -> bool:
        return (await bus.js.consumer_info(NLP_RUNS, "t-closed")).num_waiting == 1

    await async_wait_until(request_open, 15, "the first reader's pull request at the server")
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting  # the fetch is over before the reader closes
    await first.close()
    await bus.publish_many([step(0)])
    seen: list[int] = []

    async def handler(batch: list[Delivery]) -> None:
        seen.extend(d.event.data.step for d in batch)  # type: ignore[attr-defined]

    await consume_until(bus, spec, handler, lambda: seen == [0], "the event, to the next reader")


async def test_a_consumer_that_vanished_is_made_again_from_where_it_had_got_to(bus: Bus) -> None:
    spec = ConsumerSpec(durable="t-vanish", stream=NLP_RUNS, filter_subjects=[event_filter("step.done")])
    await bus.publish_many([step(i) for i in range(5)])
    last = (await bus.js.stream_info(NLP_RUNS)).state.last_seq
    seen: list[int] = []

    async def handler(batch: list[Delivery]) -> None:
        seen.extend(d.event.data.step for d in batch)  # type: ignore[attr-defined]

    consumer = await bus.consumer(spec)
    consumer.check_every_s = 0.2
    task = asyncio.create_task(consumer.run(handler, fetch_timeout_s=0.2))
    try:
        await async_wait_until(lambda: len(seen) == 5 and consumer.ack_floor == last, 15, "5 done, as the server says")
        await bus.js.delete_consumer(NLP_RUNS, "t-vanish")  # as an admin's mistake, or a server's lost state
        await bus.publish_many([step(i) for i in range(5, 8)])
        await async_wait_until(lambda: len(seen) == 8, 15, "the events published after the consumer vanished")
        info = await bus.js.consumer_info(NLP_RUNS, "t-vanish")
    finally:
        consumer.stop()
        await task
        await consumer.close()
    assert seen == list(range(8)) and consumer.stats.recreated == 1  # none skipped, none handled twice
    assert info.config.opt_start_seq == last + 1 and info.config.filter_subjects == [event_filter("step.done")]


async def test_a_poison_event_is_dead_lettered_and_does_not_hold_back_the_others(bus: Bus) -> None:
    spec = ConsumerSpec(
        durable="t-poison",
        stream=RUNS_STREAM,
        filter_subjects=[event_filter("step.done")],
        max_deliver=3,
        retry_delays_s=(0.05,),
    )
    handled: list[int] = []
    attempts: dict[int, int] = {}

    async def handler(batch: list[Delivery]) -> None:
        for d in batch:
            n = d.event.data.step  # type: ignore[attr-defined]
            if n == 2:
                attempts[n] = attempts.get(n, 0) + 1
                raise RuntimeError("cannot handle step 2")
        handled.extend(d.event.data.step for d in batch)  # type: ignore[attr-defined]

    await bus.publish_many([step(i) for i in range(5)])
    consumer = await consume_until(bus, spec, handler, dead_lettered(bus), "the poison event in DEADLETTER")
    assert sorted(handled) == [0, 1, 3, 4]
    assert attempts[2] >= 3  # the first delivery is tried in its batch, then alone
    assert consumer.stats.dead_lettered == 1
    dead = await bus.js.get_last_msg(DEADLETTER_STREAM, deadletter_subject("t-poison"))
    assert dead.headers is not None
    assert dead.headers["Runctl-Error-Type"] == "RuntimeError"
    assert dead.headers["Runctl-Num-Delivered"] == "3"
    assert dead.headers["Runctl-Original-Subject"] == event_subject("nlp", "r-1", "step.done")


async def test_a_message_that_is_not_an_event_is_dead_lettered_at_once(bus: Bus) -> None:
    spec = ConsumerSpec(durable="t-garbage", stream=RUNS_STREAM, filter_subjects=[event_filter("step.done")])
    await bus.ensure_streams(teams=["nlp"])
    await bus.js.publish(event_subject("nlp", "r-1", "step.done"), b"{not json")
    await bus.publish(step(1))
    handled: list[int] = []

    async def handler(batch: list[Delivery]) -> None:
        handled.extend(d.event.data.step for d in batch)  # type: ignore[attr-defined]

    parked = dead_lettered(bus)

    async def both() -> bool:
        return handled == [1] and await parked()

    await consume_until(bus, spec, handler, both, "the valid event handled and the garbage in DEADLETTER")
    dead = await bus.js.get_last_msg(DEADLETTER_STREAM, deadletter_subject("t-garbage"))
    assert dead.data == b"{not json"
    assert dead.headers is not None and dead.headers["Runctl-Error-Type"] == "EventError"


async def test_publish_many_keeps_at_most_a_window_unacknowledged(bus: Bus) -> None:
    bus._window = 50
    acks = await bus.publish_many([step(i) for i in range(1000)])
    assert [a.seq for a in acks] == list(range(1, 1001))


async def test_a_full_runs_stream_refuses_its_teams_events_and_keeps_what_it_has(bus: Bus) -> None:
    await bus.ensure_streams(StreamLimits(runs_max_bytes=4096), teams=["nlp", "vision"])
    kept: list[int] = []
    with pytest.raises(PublishError) as info:
        for n in range(100):
            await bus.publish(step(n), timeout_s=2.0)
            kept.append(n)
    assert info.value.run_id == "r-1" and "maximum bytes" in info.value.message
    stored = await bus.js.stream_info(NLP_RUNS)
    assert 0 < stored.state.messages == len(kept) and stored.state.first_seq == 1  # nothing it had was dropped
    other = new_event(StepDone(step=1, metrics={}), team="vision", run_id="r-1", source="/t")
    assert (await bus.publish(other)).stream == team_stream(RUNS_STREAM, "vision")  # another team's still go in


async def test_a_family_consumer_reads_every_teams_stream_and_joins_new_ones(bus: Bus) -> None:
    spec = ConsumerSpec(durable="t-family", stream=RUNS_STREAM, filter_subjects=[event_filter("step.done")])
    await bus.publish(step(1))
    seen: list[tuple[str, int]] = []
    busy = 0

    async def handler(batch: list[Delivery]) -> None:
        nonlocal busy
        busy += 1
        assert busy == 1, "the handler ran for two teams at once"
        await asyncio.sleep(0.01)
        seen.extend((d.event.team, d.event.data.step) for d in batch)  # type: ignore[attr-defined]
        busy -= 1

    group = await bus.consumer(spec)
    group.rescan_s = 300.0  # type: ignore[union-attr]  # the advisory, not the rescan, must bring the new team in
    task = asyncio.create_task(group.run(handler))
    try:
        await async_wait_until(lambda: seen == [("nlp", 1)], 15, "the existing team's event")
        late = [new_event(StepDone(step=n, metrics={}), team="vision", run_id="r-1", source="/t") for n in range(3)]
        await bus.publish_many(late + [step(2)])
        await async_wait_until(lambda: len(seen) == 5, 15, "the new team's events and the old team's next")
    finally:
        group.stop()
        await task
        await group.close()
    assert sorted(seen) == [("nlp", 1), ("nlp", 2), ("vision", 0), ("vision", 1), ("vision", 2)]
    assert [n for team, n in seen if team == "vision"] == [0, 1, 2]
    assert group.stats.handled == 5 and set(group.members) == {NLP_RUNS, team_stream(RUNS_STREAM, "vision")}  # type: ignore[union-attr]


async def test_an_envelope_that_claims_another_team_than_its_subject_is_dead_lettered(bus: Bus) -> None:
    spec = ConsumerSpec(durable="t-forged", stream=RUNS_STREAM, filter_subjects=[event_filter("step.done")])
    forged = step(1)  # claims team nlp, run r-1
    await bus.ensure_streams(teams=["nlp", "vision"])
    await bus.js.publish(event_subject("vision", "r-1", "step.done"), forged.to_json())
    handled: list[str] = []

    async def handler(batch: list[Delivery]) -> None:
        handled.extend(d.event.id for d in batch)

    await consume_until(bus, spec, handler, dead_lettered(bus), "the forged event in DEADLETTER")
    assert handled == []


async def test_watch_ends_after_a_grace_when_the_trials_it_was_promised_are_gone(
    bus: Bus, nats_server: NatsServer
) -> None:
    from runctl.events import RunSucceeded
    from runctl.sdk import RunctlClient

    ending = new_event(RunSucceeded(num_trials=5), team="nlp", run_id="r-9", source="/t")
    await bus.publish_many([step(1, run_id="r-9"), ending])
    async with RunctlClient(nats_server.url, "http://127.0.0.1:1") as client:
        names = [e.name async for e in client.watch("r-9", trial_grace_s=0.3)]
    assert names == ["step.done", "run.succeeded"]


async def test_a_second_submission_with_the_same_run_id_fails_loudly(nats_server: NatsServer) -> None:
    from runctl.config import resolve_text
    from runctl.errors import DuplicateRunError
    from runctl.sdk import RunctlClient, submission_event

    text = "RUN_TYPE=train\nENGINE=fake\nPROJECT_NAME=p\nEXP_NAME=dup\nMODEL_PATH=/m\nTRAIN_FILES=/t\n"
    event = submission_event(resolve_text(text, "run.env", environ={}))
    async with RunctlClient(nats_server.url) as client:
        first = await client.publish_submission(event)
        assert first.run_id == event.runid
        with pytest.raises(DuplicateRunError, match=f"a run with the id {event.runid} was already submitted"):
            await client.publish_submission(event)  # JetStream's duplicate window drops it: the SDK says so


async def test_making_a_teams_streams_asks_again_through_a_reloads_503(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nats-server answers JetStream's API with 503 ("no responders") for a moment while it reloads (the stack reloads
    it when a team is added, just as `runctl team add` makes the team's streams)."""
    import nats.errors

    real = bus.js.stream_info
    request = bus.nc.request
    refused = []

    async def reloading(subject: str, *args: object, **kwargs: object) -> object:
        if subject.startswith("$JS.API.STREAM.INFO.") and len(refused) < 2:
            refused.append(subject)
            raise nats.errors.NoRespondersError()
        return await request(subject, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(bus.nc, "request", reloading)
    await bus.ensure_streams(teams=["reloaded"])
    assert len(refused) == 2
    assert (await real(team_stream(RUNS_STREAM, "reloaded"))).config.discard == "new"


async def test_listing_the_streams_asks_again_through_a_reloads_503(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's stack lists streams while nats-server reloads for a run login: "no responders" is asked again."""
    import nats.errors

    request = bus.nc.request
    refused = []

    async def reloading(subject: str, *args: object, **kwargs: object) -> object:
        if subject == "$JS.API.STREAM.NAMES" and len(refused) < 2:
            refused.append(subject)
            raise nats.errors.NoRespondersError()
        return await request(subject, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(bus.nc, "request", reloading)
    assert DEADLETTER_STREAM in await bus.stream_names() and len(refused) == 2
