"""Admission through the real services: a cluster of 8 GPUs, teams with quotas and weights in the registry, runs
that do not fit queued with their place and reason, admitted in fair-share order as capacity frees, a run that
could never fit its team's quota refused, a queued run cancelled off the queue, and the queue surviving a launcher
restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from runctl.bus import Bus
from runctl.teams import TeamRegistry
from tests.conftest import Services, wait_until
from tests.integration.test_lifecycle import fake_config, start_core, submit, tracked, wait_for_state

pytestmark = pytest.mark.integration


def add_teams(services: Services, teams: dict[str, tuple[float, float]]) -> None:
    """Team → (GPU quota, weight)."""

    async def go() -> None:
        bus = await Bus.connect(services.nats_url)
        try:
            registry = TeamRegistry(bus)
            for name, (gpus, weight) in teams.items():
                await registry.add(name, gpus=gpus, cpus=1000, sandboxes=1000, weight=weight)
        finally:
            await bus.close()

    asyncio.run(go())


def run_config(
    tmp_path: Path, name: str, team: str, gpus: int, steps: int = 2, delay_s: float = 0.1, **extra: str
) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    # Fake runs hold their GPUs (as admitted) for as long as their synthetic events take: the fake engine waits
    # FAKE_STEP_DELAY_SEC before each event (a phase, a trial, a step), about 27 of them for 2 steps.
    return fake_config(folder, TEAM=team, NGPUS_PER_NODE=str(gpus), GEN_TP="1", FAKE_NUM_STEPS=str(steps),
                       FAKE_STEP_DELAY_SEC=str(delay_s), EXP_NAME=name, **extra)  # fmt: skip


def event(services: Services, run_id: str, name: str) -> dict[str, Any] | None:
    record = tracked(services, run_id) or {}
    return next((e for e in record.get("events", []) if e["name"] == name), None)


def state(services: Services, run_id: str) -> str:
    return str(((tracked(services, run_id) or {}).get("run") or {}).get("state"))


@pytest.mark.timeout(300)
def test_runs_queue_within_quotas_and_are_admitted_in_fair_share_order(
    services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNCTL_CLUSTER_GPUS", "8")
    start_core(services)
    add_teams(services, {"nlp": (12, 1), "vision": (8, 2), "speech": (2, 1)})
    # nlp takes the whole cluster with two runs (about 75 s each: long enough for the others to queue behind them
    # and the launcher to restart under them); then everyone else waits. The runs that wait are short.
    first = submit(services, run_config(tmp_path, "n1", "nlp", 4, steps=4, delay_s=1.5))
    second = submit(services, run_config(tmp_path, "n2", "nlp", 4, steps=4, delay_s=1.5))
    for run_id in (first, second):
        wait_for_state(services, run_id, "running", 60)
    over_quota = submit(services, run_config(tmp_path, "s1", "speech", 4))
    vision = submit(services, run_config(tmp_path, "v1", "vision", 4))
    nlp_third = submit(services, run_config(tmp_path, "n3", "nlp", 4))
    doomed = submit(services, run_config(tmp_path, "v2", "vision", 4))
    wait_until(lambda: all(event(services, r, "run.queued") for r in (vision, nlp_third, doomed)), 60, "queued")
    queued = {r: event(services, r, "run.queued")["data"] for r in (vision, nlp_third, doomed)}  # type: ignore[index]
    # A run larger than its team's whole quota could never start: refused with the numbers, not queued for ever.
    wait_for_state(services, over_quota, "failed", 30)
    refused = event(services, over_quota, "run.failed")["data"]  # type: ignore[index]
    assert refused["phase"] == "admission" and event(services, over_quota, "run.queued") is None
    assert "it asks for 4 GPUs and team speech's whole quota is 2: it could never start" in refused["message"]
    assert queued[vision]["reason"] == "the cluster's GPUs: 8 of 8 in use, this run needs 4"
    assert queued[nlp_third]["reason"] == "the cluster's GPUs: 8 of 8 in use, this run needs 4"
    # vision (weight 2, holding nothing) is ahead of nlp (holding 8); vision's second run behind its first.
    assert queued[vision]["position"] < queued[nlp_third]["position"]
    assert queued[doomed]["reason"] == "behind team vision's earlier or higher-priority runs"

    # A queued run cancelled leaves the queue and never starts.
    async def cancel() -> None:
        bus = await Bus.connect(services.nats_url)
        from runctl.sdk import RunctlClient

        async with RunctlClient(services.nats_url, services.tracker_url) as client:
            await client.cancel(doomed, team="vision")
        await bus.close()

    asyncio.run(cancel())
    wait_for_state(services, doomed, "cancelled", 30)
    assert event(services, doomed, "run.cancelled")["data"]["phase"] == "queue"  # type: ignore[index]

    # The launcher restarts with runs queued: the queue is in the ledger, not in its memory.
    services.stop("launcher")
    services.start("launcher")
    # As nlp's runs end, vision's run goes first (fair share), then nlp's third.
    wait_for_state(services, vision, "succeeded", 120)
    wait_for_state(services, nlp_third, "succeeded", 120)
    admitted_at = {r: event(services, r, "run.admitted")["time"] for r in (vision, nlp_third)}  # type: ignore[index]
    assert admitted_at[vision] <= admitted_at[nlp_third]
    assert event(services, vision, "run.admitted")["data"]["resources"]["gpus"] == 4  # type: ignore[index]
    assert event(services, over_quota, "run.admitted") is None and event(services, doomed, "run.admitted") is None


async def test_a_run_is_queued_once_and_granted_once_whichever_launcher_asks(nats_server: Any) -> None:
    from services.launcher.ledger import Grant, Ledger, Queued

    bus = await Bus.connect(nats_server.url)
    try:
        ledgers = [await Ledger.open(bus), await Ledger.open(bus)]  # two launchers, one ledger
        queued = Queued("nlp", {"gpus": 4.0, "cpus": 0.0, "sandboxes": 8.0}, 1, 1.0)
        assert [await ledger.enqueue("r1", queued) for ledger in ledgers] == [True, False]
        grants = await asyncio.gather(*(ledger.grant("r1", Grant("nlp", {"gpus": 4.0}, 1.0)) for ledger in ledgers))
        assert sorted(grants) == [False, True]
        assert list(await ledgers[1].grants()) == ["r1"] and list(await ledgers[0].queued()) == ["r1"]
        assert await ledgers[0].active() == {}  # neither a grant nor a queue entry is a run entry
        await ledgers[0].release("r1")
        await ledgers[1].dequeue("r1")
        assert await ledgers[0].grants() == {} and await ledgers[1].queued() == {}
    finally:
        await bus.close()
