"""Evaluation on every checkpoint, against a real nats-server: each checkpoint gets exactly one eval run, however
often its event comes and whichever launcher hears it; the cap queues the rest; the base model is step 0; a
cancelled train run's eval runs still go on. Eval runs carried for real, on a stack, are the demo's
(tests/e2e/test_readme.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runctl.bus import Bus
from runctl.config import load_config
from runctl.events import (
    CheckpointSaved,
    ConfigSubmitted,
    EvalRequested,
    RunCancelled,
    RunSucceeded,
    new_event,
    parse_event,
)
from runctl.events.payloads import RUNS_STREAM
from runctl.sdk import submission_event
from runctl.subjects import run_filter, team_stream
from services.launcher.carry.books import Books
from services.launcher.evals import Evals
from services.launcher.evalstore import EvalStore, eval_run_id
from services.launcher.ledger import Ledger
from services.launcher.settings import LauncherSettings
from tests.conftest import ROOT

pytestmark = pytest.mark.integration
PARENT = "train-evals-20261201-0000000000000001"


async def submitted_parent(bus: Bus, tmp_path: Path, via: str = "cli", **values: Any) -> None:
    settings = {
        "RUN_TYPE": "train", "TEAM": "demo", "ENGINE": "local", "PROJECT_NAME": "p", "EXP_NAME": "train-evals",
        "MODEL_PATH": str(tmp_path / "base"), "TRAIN_FILES": str(ROOT / "examples" / "tasks"),
        "NGPUS_PER_NODE": "0", "GEN_TP": "1", "EVAL_ON_CHECKPOINT": "1",
        "EVAL_DATASET": str(ROOT / "examples" / "tasks-heldout"), "OUTPUT_DIR": str(tmp_path / "run"), **values,
    }  # fmt: skip
    path = tmp_path / "train.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    await bus.ensure_streams()
    await bus.publish(submission_event(load_config(path, environ={}), via=via, run_id=PARENT))  # type: ignore[arg-type]


def checkpoint(step: int, tmp_path: Path) -> Any:
    """A checkpoint of the parent, in its run folder (``OUTPUT_DIR``): one named elsewhere is not evaluated."""
    path = tmp_path / "run" / "checkpoints" / f"global_step_{step}" / "huggingface"
    saved = CheckpointSaved(step=step, path=str(path), format="hf", num_bytes=1)
    return new_event(saved, team="demo", run_id=PARENT, source="/test", event_id=f"{PARENT}.checkpoint.{step}")


async def run_events(bus: Bus, run_id: str) -> list[Any]:
    found = []
    sub = await bus.js.subscribe(run_filter(run_id), stream=team_stream(RUNS_STREAM, "demo"), ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except TimeoutError:
                return found
            found.append(parse_event(msg.data))
    finally:
        await sub.unsubscribe()


async def launcher_evals(bus: Bus) -> Evals:
    """The launcher's evals, with RUNCTL_MAX_EVALS_IN_FLIGHT as this environment sets it (as the service reads it)."""
    books = Books(bus, await Ledger.open(bus), "/runctl/launcher")
    return Evals(books, await EvalStore.open(bus), LauncherSettings.from_env().max_evals_in_flight)


async def test_a_checkpoint_gets_one_eval_run_however_often_its_event_comes(bus: Bus, tmp_path: Path) -> None:
    await submitted_parent(bus, tmp_path)
    evals = await launcher_evals(bus)
    await evals.on_checkpoint(checkpoint(2, tmp_path))
    await evals.on_checkpoint(checkpoint(2, tmp_path))  # redelivered
    await (await launcher_evals(bus)).on_checkpoint(checkpoint(2, tmp_path))  # a restarted launcher hears it again
    child = eval_run_id(PARENT, 2)
    submissions = [e for e in await run_events(bus, child) if isinstance(e.data, ConfigSubmitted)]
    assert len(submissions) == 1 and submissions[0].data.via == "launcher"
    values = {k: v["value"] for k, v in submissions[0].data.resolved.items()}
    assert values["RUN_TYPE"] == "eval" and values["MODEL_PATH"] == str(
        tmp_path / "run" / "checkpoints" / "global_step_2" / "huggingface"
    )
    assert values["PARENT_RUN"] == PARENT and values["CHECKPOINT_STEP"] == "2"
    assert values["DATASET_PATH"] == str(ROOT / "examples" / "tasks-heldout")
    requested = [e.data for e in await run_events(bus, PARENT) if isinstance(e.data, EvalRequested)]
    assert [(r.checkpoint_step, r.eval_run_id) for r in requested] == [(2, child)]
    assert (tmp_path / "run" / "evals" / "step_2.env").is_file()


async def test_the_cap_queues_evals_until_one_ends_and_the_base_model_is_step_0(
    bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNCTL_MAX_EVALS_IN_FLIGHT", "1")
    await submitted_parent(bus, tmp_path)
    evals = await launcher_evals(bus)
    _, config = await evals.books.submitted_config("demo", PARENT)
    await evals.on_admitted("demo", PARENT, config)  # type: ignore[arg-type]
    await evals.on_checkpoint(checkpoint(3, tmp_path))
    await evals.on_checkpoint(checkpoint(6, tmp_path))
    states = {e.step: e.state for e in await evals.store.entries(PARENT)}
    assert states == {0: "submitted", 3: "queued", 6: "queued"}
    assert await evals.store.pinned(PARENT) == {0, 3, 6}
    first_end = new_event(RunSucceeded(score=0.5), team="demo", run_id=eval_run_id(PARENT, 0), source="/test")
    await evals.on_end(first_end)
    states = {e.step: e.state for e in await evals.store.entries(PARENT)}
    assert states == {0: "ended", 3: "submitted", 6: "queued"}
    assert await evals.store.pinned(PARENT) == {3, 6}
    submitted = [e for e in await run_events(bus, eval_run_id(PARENT, 0)) if isinstance(e.data, ConfigSubmitted)]
    assert {k: v["value"] for k, v in submitted[0].data.resolved.items()}["MODEL_PATH"] == str(tmp_path / "base")
    # The train run is cancelled: its eval runs are runs of their own, so the one in flight goes on and the queued one
    # is still submitted when a slot frees.
    cancelled = RunCancelled(requested_by="someone", phase="loop")
    await evals.on_end(new_event(cancelled, team="demo", run_id=PARENT, source="/test"))
    assert {e.step: e.state for e in await evals.store.entries(PARENT)} == {0: "ended", 3: "submitted", 6: "queued"}
    await evals.on_end(new_event(RunSucceeded(score=0.5), team="demo", run_id=eval_run_id(PARENT, 3), source="/t"))
    assert {e.step: e.state for e in await evals.store.entries(PARENT)} == {0: "ended", 3: "ended", 6: "submitted"}
    last = [e for e in await run_events(bus, eval_run_id(PARENT, 6)) if isinstance(e.data, ConfigSubmitted)]
    assert len(last) == 1


async def test_a_train_run_without_eval_on_checkpoint_gets_none(bus: Bus, tmp_path: Path) -> None:
    await submitted_parent(bus, tmp_path, EVAL_ON_CHECKPOINT="0")
    evals = await launcher_evals(bus)
    await evals.on_checkpoint(checkpoint(2, tmp_path))
    assert await evals.store.entries(PARENT) == []


async def test_a_checkpoint_is_pinned_before_its_event_goes_out(bus: Bus, tmp_path: Path) -> None:
    """However late the launcher hears of a checkpoint, a prune at the runner's next save cannot delete it first: the
    runner records its eval (pinned) before it publishes checkpoint.saved."""
    from services.launcher.context import RunContext
    from services.launcher.evalstore import eval_pin
    from services.launcher.trainer import checkpoints

    await submitted_parent(bus, tmp_path)
    store = await EvalStore.open(bus)
    pinned_when_published: list[set[int]] = []

    async def emit(payload: Any, key: str) -> None:
        pinned_when_published.append(await store.pinned(PARENT))

    async def save(state: dict[str, Any]) -> None:
        return None

    books = Books(bus, await Ledger.open(bus), "/runctl/test")
    _, config = await books.submitted_config("demo", PARENT)
    ctx = RunContext(PARENT, "demo", config, tmp_path / "run", emit, save)
    ctx.pin_checkpoint = eval_pin(bus, "demo", PARENT)
    ctx.pinned_checkpoints = lambda: store.pinned(PARENT)
    for step in (1, 2, 3):
        folder = checkpoints.published_folder(tmp_path / "run", step) / checkpoints.HF
        folder.mkdir(parents=True)
        await ctx.emit(CheckpointSaved(step=step, path=str(folder), format="hf", num_bytes=1), f"checkpoint.{step}")
    assert pinned_when_published == [{1}, {1, 2}, {1, 2, 3}]
    # MAX_CKPT_TO_KEEP=1 with all three pinned (no eval ran yet): nothing is deleted.
    assert checkpoints.prune(tmp_path / "run", 1, await ctx.pinned_checkpoints()) == []
