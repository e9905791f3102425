"""Attacks on the bus's storage by a team that floods it, against nats-server with runctl's generated configuration:
a run's login pushing trial events, a team's login pushing the events it may author, and an event id copied from
the victim's deterministic ids. Each team's events live in streams of their own (RUNS_<team>, TRIALS_<team>), so
the flood fills and discards within the attacker's streams only: the victim's unconsumed events stay, its next ones
are taken, and none of its ids is a duplicate of the attacker's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import nats
import nats.js.errors
import pytest
from nats.js import api

from runctl.bus import Bus, StreamLimits
from runctl.errors import PublishError
from runctl.events import CancelRequested, CheckpointSaved, TrialFinished, new_event
from runctl.events.payloads import RUNS_STREAM, TRIALS_STREAM
from runctl.natsauth import SERVICES_USER, VIEW_STREAM, RunUser, nats_hash, run_user, team_account
from runctl.subjects import team_stream
from runctl.teams import Team
from tests.infra.bus_attacks import ATTACKER, VICTIM, nats_bus
from tests.infra.bus_attacks import Bus as NatsBus

pytestmark = pytest.mark.integration

FLOOD_RUN, FLOOD_PASSWORD = "flood", "flood-secret"
SMALL = StreamLimits(runs_max_bytes=32 * 1024, trials_max_bytes=32 * 1024)


def with_flood_runner(config: dict[str, Any]) -> None:
    config["accounts"]["RUNCTL"]["users"].append(RunUser(ATTACKER, FLOOD_RUN, nats_hash(FLOOD_PASSWORD)).entry())


@pytest.fixture
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsBus]:
    with nats_bus(tmp_path_factory.mktemp("bus"), with_flood_runner) as server:
        yield server


def trial(team: str, run_id: str, n: int) -> Any:
    finished = TrialFinished(task=f"task-{n}", trial=n, reward=1.0, termination_reason="agent_completed")
    return new_event(finished, team=team, run_id=run_id, source="/t")


async def victim_streams(services: Bus) -> dict[str, tuple[int, int, dict[str, int]]]:
    """(first sequence, messages, subjects) of each of the victim's streams."""
    found = {}
    for family in (RUNS_STREAM, TRIALS_STREAM):
        info = await services.js.stream_info(team_stream(family, VICTIM), subjects_filter=">")
        found[family] = (info.state.first_seq, info.state.messages, dict(info.state.subjects or {}))
    return found


async def services_with_small_streams(bus: NatsBus) -> Bus:
    services = await Bus.connect(bus.url(SERVICES_USER), as_team=False)
    await services.ensure_streams(SMALL, teams=[VICTIM, ATTACKER])
    await services.publish(trial(VICTIM, "v-run", 0))  # the victim's trial no one has consumed yet
    return services


async def test_a_runners_trial_flood_never_pushes_out_another_teams_unconsumed_trial(bus: NatsBus) -> None:
    services = await services_with_small_streams(bus)
    before = await victim_streams(services)
    runner = await Bus.connect(
        f"nats://{run_user(ATTACKER, FLOOD_RUN)}:{FLOOD_PASSWORD}@127.0.0.1:{bus.port}", as_team=False
    )
    try:
        for start in range(0, 400, 100):
            await runner.publish_many([trial(ATTACKER, FLOOD_RUN, n) for n in range(start, start + 100)])
        flooded = await services.js.stream_info(team_stream(TRIALS_STREAM, ATTACKER))
        assert flooded.state.first_seq > 1 and flooded.state.bytes <= SMALL.trials_max_bytes  # its own ring turned
        assert await victim_streams(services) == before
        assert (await services.publish(trial(VICTIM, "v-run", 1))).stream == team_stream(TRIALS_STREAM, VICTIM)
    finally:
        await runner.close()
        await services.close()


async def test_a_team_that_fills_its_runs_stream_stops_itself_and_no_one_else(bus: NatsBus) -> None:
    services = await services_with_small_streams(bus)
    before = await victim_streams(services)
    attacker = await Bus.connect(bus.url(ATTACKER), as_team=False)
    try:
        with pytest.raises(PublishError, match="maximum bytes"):
            for n in range(1000):
                cancel = CancelRequested(requested_by=ATTACKER, reason="x" * 200)
                await attacker.publish(new_event(cancel, team=ATTACKER, run_id=f"n-{n}", source="/nlp"))
        assert await victim_streams(services) == before
        victim = await Bus.connect(bus.url(VICTIM), as_team=False)
        try:
            cancel = CancelRequested(requested_by=VICTIM)
            ack = await victim.publish(new_event(cancel, team=VICTIM, run_id="v-run", source="/vision"))
        finally:
            await victim.close()
        assert ack.stream == team_stream(RUNS_STREAM, VICTIM) and not ack.duplicate
    finally:
        await attacker.close()
        await services.close()


async def test_an_event_id_copied_from_the_victim_does_not_make_its_event_a_duplicate(bus: NatsBus) -> None:
    services = await services_with_small_streams(bus)
    attacker = await nats.connect(bus.url(ATTACKER))
    try:
        victim_id = "v-run.checkpoint.10"  # the deterministic id the victim's runner will give its checkpoint
        forged = new_event(CancelRequested(requested_by=ATTACKER), team=ATTACKER, run_id="n-run", source="/nlp")
        subject = forged.nats_subject
        ack = await attacker.jetstream().publish(subject, forged.to_json(), headers={"Nats-Msg-Id": victim_id})
        assert not ack.duplicate  # taken, in the attacker's own stream, before the victim publishes
        saved = CheckpointSaved(step=10, path="/ckpt/global_step_10", format="hf", num_bytes=1)
        ack = await services.publish(new_event(saved, team=VICTIM, run_id="v-run", source="/t", event_id=victim_id))
        assert not ack.duplicate and ack.stream == team_stream(RUNS_STREAM, VICTIM)
        stored = await services.js.get_last_msg(ack.stream, f"runctl.{VICTIM}.v-run.checkpoint.saved")
        assert stored.data is not None and b"global_step_10" in stored.data
    finally:
        await attacker.close()
        await services.close()


def with_few_consumers(config: dict[str, Any]) -> None:
    """The attacker's account as `runctl team add nlp --consumers 3` writes it."""
    config["accounts"][team_account(ATTACKER)]["jetstream"] = Team(ATTACKER, consumers=3).nats_user().limits.jetstream()


def test_a_team_holds_no_more_consumers_than_its_quota(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Team nlp, allowed 3 consumers, opens watches of its view until the bus refuses: it holds 3, and vision's
    account still opens its six."""

    async def open_until_refused(url: str) -> int:
        nc = await nats.connect(url)
        js, opened = nc.jetstream(), 0
        try:
            for _ in range(6):
                try:
                    await js.add_consumer(VIEW_STREAM, api.ConsumerConfig(ack_policy=api.AckPolicy.NONE))
                except nats.js.errors.APIError:
                    break
                opened += 1
        finally:
            await nc.close()
        return opened

    with nats_bus(tmp_path_factory.mktemp("bus"), with_few_consumers) as server:
        held = [asyncio.run(open_until_refused(server.url(who))) for who in (ATTACKER, VICTIM)]
    assert held == [3, 6]
