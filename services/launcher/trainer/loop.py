"""The loop of a train run: TRL's trainer in a worker thread, runctl's trial loop as its rollout, and after each
update the weight sync, the events and the checkpoints.

Per step ``s``: the trainer hands over ``TRAIN_BSZ`` tasks (each ``N_RESP`` times); their trials run through the
same ``TrialLoop`` as an infer run's (sandboxes, agent, verifier, the proxy's capture), numbered from
``(s - 1) × N_RESP`` in ``trials/<task>/trial-<k>``; their sequences and rewards become the batch; TRL updates and
writes the step's resume point; then the replicas reload the new weights, ``step.done`` is published (and
``checkpoint.saved`` every ``SAVE_FREQ`` steps and at the last), and the older resume point goes.

Resuming (the runner died and was started again): training continues from the newest *complete* resume point
(``runctl_step.json`` written in it); the replicas are first synced to it; its step's events are published again
with the same ids and values (a repeat is dropped), so none is lost and none differs; the next step's finished
trials are reused (they were sampled from exactly those weights).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from runctl.config import TrainConfig
from runctl.events import CheckpointSaved, StepDone
from runctl.home import write_atomic
from runctl.layout import TRAJECTORY, trial_folder
from runctl.tasks import Task
from services.launcher.context import RunContext
from services.launcher.errors import EngineError
from services.launcher.rollout.trials import TrialLoop
from services.launcher.trainer import checkpoints, grpo
from services.launcher.trainer.samples import FILTER_REASONS, Filters, Sample, balance_filtered, sample_of
from services.launcher.trainer.settings import Plan, kl_coef, plan
from services.launcher.weights.base import WeightSync

log = logging.getLogger(__name__)
STEP_RECORD = "runctl_step.json"

#: Builds the trial loop of one step: (tasks, first trial number) → loop.
MakeTrialLoop = Callable[[list[Task], int], TrialLoop]
Pinned = Callable[[], Awaitable[set[int]]]


def filters_of(config: TrainConfig) -> Filters:
    return Filters(
        timeout=config.traj_filter_timeout,
        env_setup_failed=config.traj_filter_env_setup_failed,
        overlong=config.traj_filter_overlong,
        error=config.traj_filter_error,
        max_prompt=config.max_prompt,
        max_resp=config.max_resp,
    )


def step_metrics(
    samples: list[Sample], logs: dict[str, float], timings: dict[str, float], beta: float
) -> dict[str, float]:
    """One step's figures under verl's names where verl has one (TRL's own keys are kept beside them)."""
    scores = [s.score for s in samples]
    lengths = [s.model_tokens for s in samples]
    metrics: dict[str, float] = {
        "critic/score/mean": fmean(scores),
        "critic/score/max": max(scores),
        "critic/score/min": min(scores),
        "critic/rewards/mean": fmean(s.reward for s in samples),
        "response_length/mean": fmean(lengths),
        "response_length/max": float(max(lengths)),
        "response_length/min": float(min(lengths)),
        "traj/extra_sequences": float(sum(s.extra_sequences for s in samples)),
    }
    for reason in FILTER_REASONS:
        metrics[f"traj_filter/{reason}"] = float(sum(1 for s in samples if s.filtered == reason))
    renamed = {
        "loss": "actor/pg_loss",
        "entropy": "actor/entropy",
        "grad_norm": "actor/grad_norm",
        "learning_rate": "actor/lr",
        "clip_ratio/region_mean": "actor/pg_clipfrac",
    }
    if beta > 0:
        renamed["kl"] = "actor/ppo_kl"
    for trl_key, verl_key in renamed.items():
        if trl_key in logs:
            metrics[verl_key] = logs[trl_key]
    for key, value in logs.items():
        if key not in ("epoch", "step_time", "num_tokens"):
            metrics[f"trl/{key}"] = value
    metrics.update({f"timing_s/{k}": v for k, v in timings.items()})
    return metrics


@dataclass
class TrainLoop:
    ctx: RunContext
    config: TrainConfig
    tasks: list[Task]
    make_trial_loop: MakeTrialLoop
    sync: WeightSync
    pinned: Pinned
    pad_id: int = 0
    loop: asyncio.AbstractEventLoop = field(init=False)
    by_id: dict[str, Task] = field(init=False)
    timings: dict[int, dict[str, float]] = field(default_factory=dict)
    samples: dict[int, list[Sample]] = field(default_factory=dict)
    step_started: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_id = {t.id: t for t in self.tasks}

    @property
    def run_dir(self) -> Path:
        return self.ctx.run_dir

    @property
    def plan(self) -> Plan:
        return plan(self.config, len(self.tasks))

    # ------------------------------------------------------------------------------------------------ the run
    async def run(self) -> dict[str, Any]:
        """Train to the end; returns the record of the last step.

        Raises:
            RunCancelledError: the run was cancelled (training stops after the step in flight).
            EngineError: as the trial loop or the sync raise it.
        """
        self.loop = asyncio.get_running_loop()
        resume_from = await self.resume_point()
        output_dir = checkpoints.state_dir(self.run_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(grpo.train, self.config, [t.id for t in self.tasks], output_dir, self, resume_from)
        self.ctx.check_cancelled()
        last = checkpoints.latest_resume_point(self.run_dir)
        record = json.loads((last / STEP_RECORD).read_text()) if last and (last / STEP_RECORD).is_file() else {}
        return record

    async def resume_point(self) -> Path | None:
        """The newest complete resume point, its step announced again and the replicas synced to it; incomplete
        ones (the runner died while it was being made) are removed."""
        points = checkpoints.resume_points(self.run_dir)
        complete = {s: p for s, p in points.items() if (p / STEP_RECORD).is_file()}
        newest = max(complete) if complete else None
        for step, path in points.items():
            if newest is None or step > newest:
                shutil.rmtree(path, ignore_errors=True)
        if newest is None:
            return None
        point = complete[newest]
        record = json.loads((point / STEP_RECORD).read_text())
        report = await self.sync.sync(point, newest)
        log.info("resuming after step %d (replicas synced in %.2f s)", newest, report.seconds)
        await self.announce(newest, point, record)
        return point

    # -------------------------------------------------------------------------------- hooks (trainer thread)
    def rollout(self, step: int, task_ids: list[str]) -> list[Sample]:
        return asyncio.run_coroutine_threadsafe(self.rollout_step(step, task_ids), self.loop).result()

    def after_step(self, step: int, point: Path, logs: dict[str, float], final: bool, updated_at: float) -> bool:
        future = asyncio.run_coroutine_threadsafe(self.finish_step(step, point, logs, final, updated_at), self.loop)
        return future.result()

    # ------------------------------------------------------------------------------------ steps (event loop)
    async def rollout_step(self, step: int, task_ids: list[str]) -> list[Sample]:
        self.ctx.check_cancelled()
        n = self.config.n_resp
        groups = [task_ids[i] for i in range(0, len(task_ids), n)]
        if any(task_ids[i : i + n] != [g] * n for i, g in zip(range(0, len(task_ids), n), groups, strict=True)):
            raise EngineError(
                f"step {step}: the trainer's batch is not {n} copies of each task in turn ({task_ids[:8]}…); this is "
                "a bug in runctl's use of TRL. Fix: report it with logs/runner.log.",
                phase="loop",
            )
        self.step_started[step] = time.monotonic()
        started = time.monotonic()
        tasks = [self.by_id[t] for t in groups]
        first = (step - 1) * n
        trial_loop = self.make_trial_loop(tasks, first)
        todo = await trial_loop.recover()
        log.info("step %d: %d tasks × %d trials (%d already done)", step, len(tasks), n, len(trial_loop.records))
        await trial_loop.run(todo, self.ctx.cancelled)
        self.ctx.check_cancelled()
        by_key = {(r["task"], int(r["trial"])): r for r in trial_loop.records}
        samples = []
        f = filters_of(self.config)
        for task in tasks:
            for k in range(first, first + n):
                record = by_key[(task.id, k)]
                path = trial_folder(trial_loop.trials_dir, task.id, k) / TRAJECTORY
                trajectory = json.loads(path.read_bytes()) if path.is_file() else None
                samples.append(sample_of(record, trajectory, f, self.pad_id))
        balance_filtered(samples, n)
        self.samples[step] = samples
        self.timings[step] = {"gen": time.monotonic() - started}
        return samples

    async def finish_step(self, step: int, point: Path, logs: dict[str, float], final: bool, updated_at: float) -> bool:
        """After TRL's update and save: sync, record, announce. The step's timings split its wall time into the
        rollout (``gen``), the update, the resume point TRL wrote and the published checkpoint (``save_checkpoint``),
        and the sync; ``step`` is the whole, from the rollout's start to the end of the announcement."""
        timings = self.timings.pop(step, {})
        samples = self.samples.pop(step, [])
        began = self.step_started.pop(step, time.monotonic())
        saved_at = time.monotonic()
        timings["update_actor"] = max(0.0, updated_at - began - timings.get("gen", 0.0))
        report = await self.sync.sync(point, step)
        timings["sync_weights"] = report.seconds
        publish = final or (self.config.save_freq > 0 and step % self.config.save_freq == 0)
        if publish:
            started = time.monotonic()
            await asyncio.to_thread(checkpoints.publish, self.run_dir, point, step)
            timings["save_checkpoint"] = saved_at - updated_at + time.monotonic() - started
        else:
            timings["save_checkpoint"] = saved_at - updated_at  # the resume point only
        timings["step"] = time.monotonic() - began
        metrics = step_metrics(samples, logs, timings, kl_coef(self.config))
        metrics["perf/weight_sync_restarts"] = float(getattr(self.sync, "restarts", 0))
        record = {"step": step, "metrics": metrics, "publish_checkpoint": publish, "final": final}
        write_atomic(point / STEP_RECORD, json.dumps(record, indent=2))  # the resume point is complete from here on
        await self.announce(step, point, record)
        checkpoints.drop_older_resume_points(self.run_dir, step)
        return self.ctx.cancelled.is_set()

    async def announce(self, step: int, point: Path, record: dict[str, Any]) -> None:
        """The step's events (idempotent: the ids are the step's, the values are read from its record)."""
        if record.get("publish_checkpoint"):
            hf, num_bytes = await asyncio.to_thread(checkpoints.publish, self.run_dir, point, step)
            saved = CheckpointSaved(step=step, path=str(hf), format="hf", num_bytes=num_bytes)
            await self.ctx.emit(saved, f"checkpoint.{step}")
            deleted = checkpoints.prune(self.run_dir, self.config.max_ckpt_to_keep, await self.pinned())
            if deleted:
                log.info("MAX_CKPT_TO_KEEP=%s: deleted checkpoints of steps %s", self.config.max_ckpt_to_keep, deleted)
        await self.ctx.emit(StepDone(step=step, metrics=record["metrics"]), f"step.{step}")
        await self.ctx.save(step=step)
