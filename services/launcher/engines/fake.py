"""ENGINE=fake: no model, no GPU. It walks a run through every phase and publishes the events a real engine
would, with deterministic synthetic numbers, every one marked ``synthetic``. It exists for tests and the preview
example; it is never a default.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

from runctl.config import TrainConfig
from runctl.events import CheckpointSaved, ClusterReady, PhaseStarted, ReplicasReady, StepDone, TrialFinished
from runctl.events.payloads import Payload, Phase
from services.launcher.engines.base import Outcome, RunContext
from services.launcher.errors import EngineError

NUM_FAKE_TASKS = 4
Unit = tuple[Phase, str, Payload | None]


def _reward(task: int, trial: int) -> float:
    # A spread of difficulties: task 0 always fails, the last always passes, the middle ones sometimes.
    return 1.0 if (task * 7 + trial * 3) % NUM_FAKE_TASKS < task else 0.0


def _metrics(step: int) -> dict[str, float]:
    return {
        "critic/score/mean": round(0.2 + 0.6 * (1 - math.exp(-step / 5)), 6),
        "actor/ppo_kl": round(0.001 * math.log1p(step), 6),
        "actor/entropy": round(1.5 * math.exp(-step / 20), 6),
        "response_length/mean": float(200 + 10 * step),
        "perf/mfu/actor": 0.0,
    }


class FakeEngine:
    """The synthetic engine; see the module docstring."""

    name = "fake"

    def units(self, ctx: RunContext) -> Iterator[Unit]:
        """Every event the run will emit, in order, each with a stable key."""
        config = ctx.config
        yield "environment", "phase", None
        yield "ray", "phase", None
        yield (
            "ray",
            "cluster",
            ClusterReady(
                ray_address="fake://local",
                num_nodes=config.nnodes,
                num_nodes_expected=config.nnodes,
                num_gpus=float(config.nnodes * config.ngpus_per_node),
                num_cpus=2.0,
                synthetic=True,
            ),
        )
        yield "replicas", "phase", None
        addresses = [f"fake://replica-{i}" for i in range(config.gen_dp)]
        replicas = ReplicasReady(
            addresses=addresses,
            dp=config.gen_dp,
            tp=config.gen_tp,
            model=config.served_model_name,
            health="synthetic",
            synthetic=True,
        )
        yield "replicas", "replicas", replicas
        yield "proxy", "phase", None
        total = config.fake_num_steps if isinstance(config, TrainConfig) else NUM_FAKE_TASKS * config.fake_num_steps
        yield "loop", "phase", PhaseStarted(phase="loop", total=total)
        if isinstance(config, TrainConfig):
            yield from self._train_units(ctx, config)
        else:
            yield from self._trial_units(config.fake_num_steps, step=None)
        yield "outputs", "phase", None

    def _trial_units(self, num_trials: int, step: int | None) -> Iterator[Unit]:
        for task in range(NUM_FAKE_TASKS):
            for trial in range(num_trials):
                reward = _reward(task, trial)
                payload = TrialFinished(
                    task=f"fake-task-{task}",
                    trial=trial,
                    reward=reward,
                    termination_reason="agent_completed",
                    durations_s={"agent": 0.0, "verifier": 0.0},
                    tokens={"prompt": 100, "completion": 50},
                    synthetic=True,
                )
                prefix = "" if step is None else f"step{step}."
                yield "loop", f"trial.{prefix}{task}.{trial}", payload

    def _train_units(self, ctx: RunContext, config: TrainConfig) -> Iterator[Unit]:
        num_steps = config.fake_num_steps
        for step in range(1, num_steps + 1):
            yield from self._trial_units(min(config.n_resp, 2), step)
            yield "loop", f"step.{step}", StepDone(step=step, metrics=_metrics(step), synthetic=True)
            if (config.save_freq > 0 and step % config.save_freq == 0) or step == num_steps:
                path = ctx.run_dir / "checkpoints" / f"global_step_{step}"
                yield (
                    "loop",
                    f"checkpoint.{step}",
                    CheckpointSaved(step=step, path=str(path), format="hf", num_bytes=0, synthetic=True),
                )

    async def run(self, ctx: RunContext) -> Outcome:
        done = int(ctx.progress.get("done", 0))
        rewards: list[float] = []
        delay = ctx.config.fake_step_delay_sec
        fail_at = ctx.config.fake_fail_at
        for index, (phase, key, payload) in enumerate(self.units(ctx)):
            if isinstance(payload, TrialFinished) and payload.reward is not None:
                rewards.append(payload.reward)
            if index < done:
                ctx.phase = phase
                continue
            ctx.check_cancelled()
            if payload is None or isinstance(payload, PhaseStarted):
                await ctx.enter_phase(phase, total=payload.total if payload else None)
                if fail_at and _phase_matches(fail_at, phase):
                    raise EngineError(f"FAKE_FAIL_AT={fail_at}: synthetic failure in phase {phase}", phase=phase)
            else:
                await ctx.emit(payload, key)
            await ctx.save(done=index + 1)
            if delay:
                await asyncio.sleep(delay)
        score = sum(rewards) / len(rewards) if rewards else None
        summary: dict[str, Any] = {"trials": len(rewards), "passes": int(sum(rewards)), "engine": "fake"}
        return Outcome(summary=summary, score=score, synthetic=True)


def _phase_matches(fail_at: str, phase: Phase) -> bool:
    return {"cluster": "ray"}.get(fail_at, fail_at) == phase
