"""Events a team may publish on its own subjects that name another team's run: each service keys what it does by
(team, run), so nothing of the victim's changes. The team of an event is its subject's (the bus refuses an
envelope that claims another), and a team can publish only on its own subjects."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runctl.bus import Bus
from runctl.events import CheckpointSaved, RunFailed, new_event
from services.launcher.evalstore import eval_run_id
from services.sandbox.bus_client import SandboxBusClient
from services.sandbox.ledger import SandboxLedger
from tests.conftest import ROOT, Services, async_wait_until
from tests.integration.test_evals import PARENT, checkpoint, launcher_evals, submitted_parent
from tests.integration.test_sandbox_service import _owned, scope  # noqa: F401  (a fixture)

pytestmark = pytest.mark.integration
TASKS = ROOT / "tests" / "data" / "tasks"


def failed(team: str, run_id: str, event_id: str) -> object:
    payload = RunFailed(phase="loop", error_type="Forged", message="forged")
    return new_event(payload, team=team, run_id=run_id, source="/attacker", event_id=event_id)


async def test_another_teams_end_event_naming_the_run_reaps_none_of_its_sandboxes(
    scope: str,  # noqa: F811
    services: Services,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RUNCTL_SANDBOX_BACKENDS", "local")
    await asyncio.to_thread(services.start, "sandbox")
    bus = await Bus.connect(services.nats_url, name="attack")
    try:
        client = SandboxBusClient(bus)
        await client.create("victim", TASKS / "hello", run_id="r-shared", trial="0")
        ledger = await SandboxLedger.open(bus)
        await bus.publish(failed("attacker", "r-shared", "forged-end"))  # the attacker's own subject, the victim's id

        async def heard() -> bool:
            return ("attacker", "r-shared") in await ledger.ended_runs()

        await async_wait_until(heard, 30, "the sandbox service to record the forged end")
        await asyncio.sleep(0.5)  # the reap that follows the record
        assert len(_owned("local", services, scope)) == 1, "the victim's sandbox was reaped"
        # The victim's own end reaps it (the control: the same path, keyed right).
        await bus.publish(failed("victim", "r-shared", "real-end"))

        async def reaped() -> bool:
            return not _owned("local", services, scope)

        await async_wait_until(reaped, 30, "the victim's own end to reap its sandbox")
    finally:
        await bus.close()


async def test_another_teams_end_of_an_eval_run_unpins_no_checkpoint(bus: Bus, tmp_path: Path) -> None:
    await submitted_parent(bus, tmp_path)
    evals = await launcher_evals(bus)
    await evals.on_checkpoint(checkpoint(2, tmp_path))
    assert await evals.store.pinned(PARENT) == {2}
    await evals.on_end(failed("attacker", eval_run_id(PARENT, 2), "forged-eval-end"))  # type: ignore[arg-type]
    assert await evals.store.pinned(PARENT) == {2}
    await evals.on_end(failed("demo", eval_run_id(PARENT, 2), "real-eval-end"))  # type: ignore[arg-type]
    assert await evals.store.pinned(PARENT) == set()


@pytest.mark.parametrize("where", ["another run's folder", "a path that climbs out"])
async def test_a_checkpoint_event_naming_a_folder_outside_its_run_is_not_evaluated(
    bus: Bus, tmp_path: Path, where: str
) -> None:
    """An eval run of a path the event names would read (and MAX_CKPT_TO_KEEP prune) another run's weights."""
    await submitted_parent(bus, tmp_path)
    evals = await launcher_evals(bus)
    path = (
        tmp_path / "other-team" / "run" / "checkpoints" / "global_step_2" / "huggingface"
        if where == "another run's folder"
        else tmp_path / "run" / ".." / "elsewhere" / "global_step_2"
    )
    saved = CheckpointSaved(step=2, path=str(path), format="hf", num_bytes=1)
    await evals.on_checkpoint(new_event(saved, team="demo", run_id=PARENT, source="/attacker"))
    assert await evals.store.entries(PARENT) == [] and evals.dropped == 1


@pytest.mark.parametrize("output", ["its own team's folder", "another team's folder"])
async def test_a_foreground_runs_checkpoints_are_evaluated_only_once_its_config_passes_the_checks(
    bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    """`runctl run` publishes its own submission (no validator saw it): before the launcher writes eval configs into
    its OUTPUT_DIR and prunes checkpoints there, the config passes the validator's checks, its folders included."""
    monkeypatch.setenv("RUNCTL_TEAM_PATHS", str(tmp_path / "data" / "{team}"))
    owner = "demo" if output == "its own team's folder" else "vision"
    run = tmp_path / "data" / owner / "run"
    model = str(ROOT / "tests" / "data" / "models" / "qwen3-dense")  # a model folder the checks can read
    values = {"OUTPUT_DIR": str(run), "MODEL_PATH": model, "MAX_PROMPT": "1024", "MAX_RESP": "1024"}
    await submitted_parent(bus, tmp_path, via="foreground", **values)
    evals = await launcher_evals(bus)
    hf = run / "checkpoints" / "global_step_2" / "huggingface"
    saved = CheckpointSaved(step=2, path=str(hf), format="hf", num_bytes=1)
    await evals.on_checkpoint(new_event(saved, team="demo", run_id=PARENT, source="/runctl-run"))
    entries = await evals.store.entries(PARENT)
    if owner == "demo":
        assert [e.step for e in entries] == [2] and (run / "evals" / "step_2.env").is_file()
    else:
        assert entries == [] and evals.dropped == 1 and not (run / "evals").exists()


async def test_a_config_claiming_another_team_is_rejected_and_never_carried(bus: Bus, tmp_path: Path) -> None:
    """Team nlp submits (on its own subject) a config that says TEAM=vision: vision's quota, folders, sandboxes."""
    from runctl.config import load_config
    from runctl.errors import RunctlError
    from runctl.sdk import submission_event
    from services.launcher.carry.books import Books
    from services.launcher.ledger import Ledger
    from services.validator.service import verdict

    path = tmp_path / "infer.env"
    path.write_text(
        (ROOT / "configs" / "examples" / "infer-cpu.env").read_text() + f"TEAM=vision\nOUTPUT_DIR={tmp_path}/out\n"
    )
    event = submission_event(load_config(path, environ={}), via="cli", run_id="r-claims-vision")
    forged = new_event(event.data, team="nlp", run_id="r-claims-vision", source="/attacker")
    rejected = verdict(forged.data, forged.runid, team="nlp")  # type: ignore[arg-type]
    assert rejected.event_name == "config.rejected"
    assert [c.id for c in rejected.checks if c.severity == "fatal"] == ["schema.team"]  # type: ignore[attr-defined]
    await bus.publish(forged)
    books = Books(bus, await Ledger.open(bus), "/runctl/launcher")
    with pytest.raises(RunctlError, match="submitted by team nlp but its config says TEAM=vision"):
        await books.submitted_config("nlp", "r-claims-vision")


def test_a_teams_own_config_validated_does_not_carry_a_config_that_fails_the_checks(
    services: Services, tmp_path: Path
) -> None:
    """A team may publish config.validated on its own subjects (a foreground run publishes its own): for a config
    that fails the validator's checks, written with no validator running, the launcher runs the checks itself and
    fails the run at admission, naming the check; nothing is launched."""
    from runctl.config import load_config
    from runctl.events import ConfigValidated
    from runctl.sdk import RunctlClient
    from tests.integration.test_lifecycle import wait_for_state

    config = tmp_path / "eval.env"
    values = {"RUN_TYPE": "eval", "TEAM": "nlp", "PROJECT_NAME": "p", "EXP_NAME": "forged", "NGPUS_PER_NODE": "0"}
    values |= {"GEN_TP": "1", "MODEL_PATH": str(tmp_path / "no-model"), "DATASET_PATH": str(TASKS)}
    config.write_text("".join(f"{k}={v}\n" for k, v in values.items()) + "AGENT_NAME=oracle\n")
    resolved = load_config(config, environ={})
    services.start("tracker")
    services.start("launcher")

    async def submit_and_validate_it_ourselves() -> str:
        async with RunctlClient(services.nats_url, services.tracker_url) as client:
            run_id = (await client.submit(resolved)).run_id
            forged = new_event(ConfigValidated(checks=[]), team="nlp", run_id=run_id, source="/runctl/validator")
            await (await client.bus()).publish(forged)
            return run_id

    run_id = asyncio.run(submit_and_validate_it_ourselves())
    record = wait_for_state(services, run_id, "failed")
    assert record["run"]["error"]["phase"] == "admission"
    assert "paths.model" in record["run"]["error"]["message"]
    assert not any(e["name"] in ("run.admitted", "phase.started") for e in record["events"])
