"""The validator's live probes against a real bus, tracker and launcher."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from runctl.config import load_config
from runctl.events import CheckResult
from runctl.sdk import RunctlClient
from services.validator.library import check_config
from tests.conftest import ROOT, Services, free_port
from tests.integration.test_lifecycle import fake_config, start_core, submit, wait_for_state

pytestmark = pytest.mark.integration
DATA = ROOT / "tests" / "data"


def live_results(config: Path) -> dict[str, CheckResult]:
    model = load_config(config, environ={}).model
    return {r.id: r for r in check_config(model, live=True) if r.id.startswith("services.")}


def host_results(config: Path) -> dict[str, CheckResult]:
    model = load_config(config, environ={}).model
    return {r.id: r for r in check_config(model, host=True) if r.id.startswith("services.")}


def test_an_experiment_already_in_flight_is_fatal_until_it_ends(
    services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNCTL_NATS_URL", services.nats_url)
    monkeypatch.setenv("RUNCTL_TRACKER_URL", services.tracker_url)
    start_core(services)
    config = fake_config(tmp_path, FAKE_NUM_STEPS="500", FAKE_STEP_DELAY_SEC="0.02")
    assert live_results(config)["services.no_conflicting_run"].severity == "ok"
    run_id = submit(services, config)
    wait_for_state(services, run_id, "running")
    results = live_results(config)
    assert results["services.bus"].severity == "ok"
    conflict = results["services.no_conflicting_run"]
    assert conflict.severity == "fatal" and run_id in conflict.message and "runctl cancel" in conflict.fix

    async def cancel() -> None:
        async with RunctlClient(services.nats_url, services.tracker_url) as client:
            await client.cancel(run_id)

    asyncio.run(cancel())
    wait_for_state(services, run_id, "cancelled")
    assert live_results(config)["services.no_conflicting_run"].severity == "ok"


def test_unreachable_bus_warns_and_unreachable_tracker_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNCTL_NATS_URL", f"nats://127.0.0.1:{free_port()}")
    monkeypatch.setenv("RUNCTL_TRACKER_URL", f"http://127.0.0.1:{free_port()}")
    results = live_results(fake_config(tmp_path))
    assert results["services.bus"].severity == "warn" and "runctl up" in results["services.bus"].fix
    assert results["services.no_conflicting_run"].severity == "skip"


def test_a_taken_ray_port_is_fatal_for_a_local_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNCTL_TRACKER_URL", f"http://127.0.0.1:{free_port()}")
    config = fake_config(
        tmp_path, ENGINE="local", MODEL_PATH=str(DATA / "models" / "llama-tiny"), TRAIN_FILES=str(DATA / "tasks")
    )
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            holder.bind(("127.0.0.1", 8265))
            holder.listen()
        except OSError:
            pass  # something else holds it already: the probe must say so all the same
        ports = host_results(config)["services.ray_ports"]
        submitted = live_results(config)["services.ray_ports"]  # `runctl submit`: the launcher's Ray, not ours
        monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
        inside_a_job = host_results(config)["services.ray_ports"]  # the runner's own pass, in the launcher's cluster
        monkeypatch.delenv("RAY_ADDRESS")
    assert ports.severity == "fatal" and "8265" in ports.message
    assert submitted.severity == "skip" and inside_a_job.severity == "skip"
    assert "$RAY_ADDRESS" in inside_a_job.message
    config.write_text(config.read_text() + "RAY_ADDRESS=ray://127.0.0.1:10001\n")
    assert host_results(config)["services.ray_ports"].severity == "skip"
