"""The runner's side of ENGINE=verl for real — its phases, a Ray head (in the loopback-only namespace), verl's
trainer as a child process group — with the stand-in trainer in verl's place (``stand_in_trainer.py``: verl's own
config composition, file logger and checkpoint-callback loader, no GPU). A trainer that dies is resumed by a second
runner: every step and checkpoint is published exactly once, with the figures first published."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from runctl.events import CheckpointSaved, ClusterReady, ReplicasReady, StepDone
from runctl.events.payloads import Payload
from services.launcher.engines.base import RunContext
from services.launcher.engines.verl.engine import VerlEngine
from services.launcher.errors import EngineError
from tests.infra import ray_head as ray_infra
from tests.verl.conftest import verl_train_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(ray_infra.why_unavailable() is not None, reason=str(ray_infra.why_unavailable())),
]
STAND_IN = [sys.executable, str(Path(__file__).parent / "stand_in_trainer.py")]


def context(run_dir: Path, progress: dict[str, Any], published: list[tuple[str, Payload]]) -> RunContext:
    async def emit(payload: Payload, key: str) -> None:
        published.append((key, payload))

    async def save(state: dict[str, Any]) -> None:
        progress.update(state)

    config = verl_train_config(NGPUS_PER_NODE=0, TOTAL_TRAINING_STEPS=5, SAVE_FREQ=2, MAX_CKPT_TO_KEEP=2)
    return RunContext("r1", "team", config, run_dir, emit, save, progress=dict(progress))


async def test_each_step_and_checkpoint_is_published_once_across_a_trainer_that_died(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    engine = VerlEngine(argv=STAND_IN, poll_s=0.1, discover_replicas=False)
    published: list[tuple[str, Payload]] = []
    progress: dict[str, Any] = {}
    monkeypatch.setenv("STAND_IN_DIE_AFTER", "3")
    first = context(run_dir, progress, published)
    with pytest.raises(EngineError) as died:
        await engine.run(first)
    assert died.value.phase == "loop" and "exited with code 1 after step 3" in str(died.value)
    assert (run_dir / "logs" / "verl.log").is_file()
    monkeypatch.delenv("STAND_IN_DIE_AFTER")

    outcome = await engine.run(context(run_dir, first.progress, published))
    keys = [key for key, _ in published]
    assert [k for k in keys if k.startswith("step.")] == [f"step.{s}" for s in (1, 2, 3, 4, 5)]
    assert [k for k in keys if k.startswith("checkpoint.")] == ["checkpoint.2", "checkpoint.4", "checkpoint.5"]
    figures = {p.step: p.metrics for _, p in published if isinstance(p, StepDone)}
    assert figures[3]["critic/score/mean"] == pytest.approx(0.3)  # first published; the resumed run's 0.8 is not
    assert figures[5]["critic/score/mean"] == pytest.approx(1.0)
    assert "val/generations" not in figures[1]
    saved = [p for _, p in published if isinstance(p, CheckpointSaved)]
    assert [c.path for c in saved] == [
        str(run_dir / "checkpoints" / f"global_step_{s}" / "actor" / "huggingface") for s in (2, 4, 5)
    ]
    assert all(c.num_bytes > 1000 * c.step for c in saved)
    assert sum(isinstance(p, ClusterReady) for _, p in published) == 2
    # MAX_CKPT_TO_KEEP=2: the oldest went once the third was announced.
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("global_step_*")) == ["global_step_4", "global_step_5"]
    assert outcome.summary["steps"] == 5
    assert outcome.summary["last_checkpoint"] == saved[-1].path
    assert outcome.score == pytest.approx(1.0)


async def test_the_fully_async_trainers_checkpoints_are_announced_from_its_tracker_file(tmp_path: Path) -> None:
    # verl's fully async trainer calls no checkpoint callback: the runner reads the step verl's tracker file names.
    run_dir = tmp_path / "run"
    engine = VerlEngine(argv=STAND_IN, poll_s=0.1, discover_replicas=False)
    published: list[tuple[str, Payload]] = []

    async def emit(payload: Payload, key: str) -> None:
        published.append((key, payload))

    async def save(state: dict[str, Any]) -> None:
        pass

    # 6 tasks rolled out, 1 task × 1 batch a step, weights synced every 2 steps: verl counts 3 steps.
    config = verl_train_config(
        NGPUS_PER_NODE=0,
        TRAINING_MODE="async",
        N_NODES_ROLLOUT=0,
        TRAIN_MINI_BSZ=1,
        REQUIRE_BATCHES=1,
        TRIGGER_PARAMETER_SYNC_STEP=2,
        TOTAL_ROLLOUT_STEPS=6,
        SAVE_FREQ=2,
    )
    outcome = await engine.run(RunContext("r2", "team", config, run_dir, emit, save, progress={}))
    command = (run_dir / "verl" / "command.json").read_text()
    assert "async_training.trigger_parameter_sync_step=2" in command
    keys = [key for key, _ in published]
    assert [k for k in keys if k.startswith("step.")] == ["step.1", "step.2", "step.3"]
    assert [k for k in keys if k.startswith("checkpoint.")] == ["checkpoint.2", "checkpoint.3"]
    saved = [p for _, p in published if isinstance(p, CheckpointSaved)]
    assert saved[-1].path == str(run_dir / "checkpoints" / "global_step_3" / "actor" / "huggingface")
    assert outcome.summary["steps"] == 3


async def test_verls_servers_once_up_are_published_as_replicas_ready(tmp_path: Path) -> None:
    import subprocess

    import ray

    from runctl.verl import ray_namespace
    from services.launcher.engines.verl.engine import watch_replicas

    published: list[tuple[str, Payload]] = []

    async def emit(payload: Payload, key: str) -> None:
        published.append((key, payload))

    async def save(state: dict[str, Any]) -> None:
        pass

    with ray_infra.ray_head() as head:
        config = verl_train_config(NGPUS_PER_NODE=0, GEN_TP=1).model_copy(update={"ray_address": head.gcs_address})
        # As verl's trainer makes its vllm_server_* actors, in the run's namespace; another run's on the same
        # cluster is not taken for its own.
        ray_infra.start_server_actor(head, 8123, namespace=ray_namespace("r3"))
        ray_infra.start_server_actor(head, 8999, namespace=ray_namespace("another-run"))
        trainer = subprocess.Popen(["sleep", "120"])  # verl, still running
        try:
            ctx = RunContext("r3", "team", config, tmp_path, emit, save, progress={})
            await asyncio.wait_for(watch_replicas(ctx, config, trainer), 120)
        finally:
            trainer.kill()
            trainer.wait()
            ray.shutdown()
    (ready,) = [(k, p) for k, p in published if isinstance(p, ReplicasReady)]
    assert ready[0] == "replicas"
    assert ready[1].addresses == ["http://127.0.0.1:8123"] and ready[1].dp == 1 and ready[1].tp == 1
