"""The runner's side of ENGINE=verl: launch verl's trainer and turn what it leaves behind into runctl's events.

Phases: environment (the tasks, runctl's files in the run folder, the resolved config) → ray (attach to the run's
cluster, or start a head; NNODES nodes and the GPUs the config asks for) → loop (verl's trainer as a child process in
its own process group, attached to that cluster; while it runs, every ``poll_s``: its step log becomes ``step.done``
and the outbox of runctl's plugins becomes ``checkpoint.saved``, ``trial.finished`` and ``plugin.failed``; verl's
``vllm_server_*`` actors, once up, become ``replicas.ready``) → outputs (summary.json).

A runner started again for the same run (its first died) launches verl again: verl resumes from its newest
checkpoint (``trainer.resume_mode=auto``), and the events already published are skipped (steps by number, the rest
by key). Cancelling stops verl's process group (SIGTERM, then SIGKILL after ``STOP_GRACE_S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from runctl import verl as verl_contract
from runctl.config import TrainConfig
from runctl.events import CheckpointSaved, ReplicasReady, StepDone
from services.launcher.engines.base import Outcome, RunContext
from services.launcher.engines.verl.callback import CheckpointAnnouncer
from services.launcher.engines.verl.outbox import OutboxReader
from services.launcher.engines.verl.prepare import prepare
from services.launcher.engines.verl.steplog import StepLog
from services.launcher.errors import EngineError
from services.launcher.rollout import cluster as ray_cluster
from services.launcher.trainer import checkpoints

log = logging.getLogger(__name__)
STOP_GRACE_S = 30.0
LOG_FILE = Path("logs") / "verl.log"
TRACKER = "latest_checkpointed_iteration.txt"  # verl writes the newest saved step here once its save is done


class VerlEngine:
    """See the module docstring. ``argv`` replaces the trainer's command (tests start a stand-in that writes what
    verl writes); ``poll_s`` is how often the run folder is read."""

    name = "verl"

    def __init__(self, argv: list[str] | None = None, poll_s: float = 1.0, discover_replicas: bool = True) -> None:
        self.argv = argv
        self.poll_s = poll_s
        self.discover_replicas = discover_replicas

    async def run(self, ctx: RunContext) -> Outcome:
        from services.launcher.engines.local import run_log, select_tasks, write_resolved_config

        config = ctx.config
        if not isinstance(config, TrainConfig):
            raise EngineError(
                f"ENGINE=verl carries train runs; this is a {config.run_type} run. Fix: ENGINE=local for infer and "
                "eval runs (it serves the model with vLLM on a GPU too).",
                phase="environment",
            )
        attempt = int(ctx.progress.get("attempt", 0)) + 1
        ctx.key_suffix = "" if attempt == 1 else f".attempt{attempt}"
        await ctx.save(attempt=attempt)
        async with AsyncExitStack() as stack:
            stack.enter_context(run_log(ctx.run_dir / "logs" / "runner.log"))
            await ctx.enter_phase("environment")  # verl's runtime was probed by the runner's own validator pass
            _, _, train = await asyncio.to_thread(select_tasks, config)
            val = await asyncio.to_thread(val_tasks, config)
            await asyncio.to_thread(prepare, config, ctx.run_dir, train, val, ctx.run_id)
            write_resolved_config(config, ctx.run_dir, ctx.secret_values)
            ctx.check_cancelled()

            await ctx.enter_phase("ray")
            found = await asyncio.to_thread(ray_cluster.connect, config.ray_address, config.nnodes)
            stack.push_async_callback(asyncio.to_thread, ray_cluster.release)
            need = float(config.nnodes * config.ngpus_per_node)
            if found.num_gpus < need:
                raise EngineError(
                    f"the Ray cluster at {found.address} has {found.num_gpus:g} GPUs; the run asks for {need:g} "
                    f"(NNODES={config.nnodes} × NGPUS_PER_NODE={config.ngpus_per_node}). Fix: add GPU nodes, or "
                    "lower NNODES / NGPUS_PER_NODE.",
                    phase="ray",
                )
            ready = found.ready(config.nnodes)
            await ctx.emit(ready, "cluster" + ctx.key_suffix)
            ctx.check_cancelled()

            await ctx.enter_phase("loop", total=config.total_training_steps)
            reader = Reader(ctx, config)
            bus_url = ctx.bus.url if ctx.bus is not None else None
            proc = self._launch(config, ctx.run_dir, found.address, bus_url, verl_contract.ray_namespace(ctx.run_id))
            stack.push_async_callback(asyncio.to_thread, stop_group, proc)
            if self.discover_replicas:
                stack.callback(asyncio.create_task(watch_replicas(ctx, config, proc)).cancel)
            while proc.poll() is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ctx.cancelled.wait(), self.poll_s)
                await reader.drain()
                if ctx.cancelled.is_set():
                    await asyncio.to_thread(stop_group, proc)
                    ctx.check_cancelled()
            await reader.drain()
            if proc.returncode != 0:
                raise EngineError(
                    f"verl's trainer exited with code {proc.returncode} after step {reader.steps.last_step}. Its "
                    f"output is in {ctx.run_dir / LOG_FILE}; the end of it:\n{log_tail(ctx.run_dir / LOG_FILE)}\n"
                    "Fix: correct what it names, then resume the run (verl continues from its last checkpoint).",
                    phase="loop",
                )
            await ctx.enter_phase("outputs")
            return write_outputs(ctx.run_dir, reader)
        raise AssertionError("unreachable")  # pragma: no cover

    def _launch(
        self, config: TrainConfig, run_dir: Path, ray_address: str, bus_url: str | None, namespace: str
    ) -> subprocess.Popen[bytes]:
        argv = verl_contract.launch_argv(config, str(run_dir.resolve()), sys.executable)
        if self.argv is not None:
            argv = [*self.argv, *argv[3:]]  # a stand-in trainer, with the same overrides
        argv.append(f"+{verl_contract.RAY_NAMESPACE_KEY}={namespace}")  # its servers are this run's, found there
        env = {**os.environ, "RAY_ADDRESS": ray_address, "WANDB_MODE": config.wandb_mode}
        # The key verl's vLLM servers require (runctl.verl.REPLICA_GUARD), new for each attempt; runctl's proxy in
        # verl's workers holds it too (host.TrialHost).
        env[verl_contract.REPLICA_KEY_ENV] = secrets.token_urlsafe(32)
        env.pop("RUNCTL_NATS_URL", None)
        if bus_url:
            env["RUNCTL_NATS_URL"] = bus_url  # the workers book their trials' sandboxes (host.TrialHost._book)
        if config.wandb_api_key:
            env["WANDB_API_KEY"] = config.wandb_api_key
        # Every actor of verl's gets these through Ray's runtime environment (runctl.verl.runtime_env_hook), never
        # named on the command line or in a file.
        env = verl_contract.driver_env(env, [*WORKER_ENV, verl_contract.REPLICA_KEY_ENV, "WANDB_API_KEY", "WANDB_MODE"])
        (run_dir / "verl" / "command.json").write_text(json.dumps(argv, indent=1))
        out = (run_dir / LOG_FILE).open("ab")
        try:
            log.info("starting verl: %s", " ".join(argv[:3]))
            return subprocess.Popen(
                argv, cwd=run_dir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            out.close()


#: What verl's workers need of the runner's environment: the bus, the home, and the sandbox deployment's settings.
WORKER_ENV = (
    "RUNCTL_NATS_URL",
    "RUNCTL_HOME",
    "RUNCTL_SANDBOX_CAPS",
    "RUNCTL_SANDBOX_DEFAULT_CAP",
    "RUNCTL_SANDBOX_SCOPE",
    "RUNCTL_SANDBOX_CGROUP",
)


class Reader:
    """Publishes what verl and runctl's plugins left in the run folder since the last look."""

    def __init__(self, ctx: RunContext, config: TrainConfig) -> None:
        self.ctx = ctx
        self.config = config
        self.steps = StepLog(ctx.run_dir / verl_contract.STEP_LOG, int(ctx.progress.get("verl_last_step", 0)))
        self.outbox = OutboxReader(ctx.run_dir)
        self.last_metrics: dict[str, float] = dict(ctx.progress.get("verl_last_metrics", {}))
        self.announced: list[int] = list(ctx.progress.get("verl_checkpoints", []))
        # verl's fully async trainer calls no checkpoint callback; the step its tracker file names, written once a
        # save is complete, is announced instead (each step once: the newest announced is where to start).
        self.tracker = ctx.run_dir / "checkpoints" / TRACKER if config.training_mode == "async" else None
        self.tracked = max(self.announced, default=0)

    def _track(self) -> None:
        try:
            step = int(self.tracker.read_text().strip()) if self.tracker is not None else 0
        except (OSError, ValueError):  # not written yet, or being written
            return
        if step <= self.tracked:
            return
        # Saves finish one after another, so every folder up to the step named is complete: a look that missed one
        # (two saves within a poll) announces it too.
        saved = [
            k for k in checkpoints.published_steps(self.ctx.run_dir, checkpoints.VERL_HF) if self.tracked < k < step
        ] + [step]
        self.tracked = step
        announcer = CheckpointAnnouncer.for_run(self.ctx.run_dir)
        for k in saved:
            announcer.on_save(global_step=k, checkpoint_dir=str(checkpoints.published_folder(self.ctx.run_dir, k)))

    async def drain(self) -> None:
        await asyncio.to_thread(self._track)
        for step, metrics in await asyncio.to_thread(lambda: list(self.steps.poll())):
            await self.ctx.emit(StepDone(step=step, metrics=metrics), f"step.{step}")
            self.last_metrics = metrics
            await self.ctx.save(verl_last_step=step, verl_last_metrics=metrics)
        for path, key, payload in await asyncio.to_thread(self.outbox.pending):
            await self.ctx.emit(payload, key)
            if isinstance(payload, CheckpointSaved) and payload.step not in self.announced:
                self.announced.append(payload.step)
                await self.ctx.save(verl_checkpoints=self.announced)
                await self.prune()
            else:
                await self.ctx.save()  # the count of trials published
            self.outbox.sent(path)

    async def prune(self) -> None:
        """MAX_CKPT_TO_KEEP, never deleting a checkpoint whose eval run has not ended (verl is not told the limit,
        since it cannot know which checkpoints an eval still reads)."""
        keep = self.config.max_ckpt_to_keep
        if keep is None:
            return
        pinned = await self.ctx.pinned_checkpoints()
        deleted = await asyncio.to_thread(checkpoints.prune, self.ctx.run_dir, keep, pinned, checkpoints.VERL_HF)
        self.announced = [s for s in self.announced if s not in deleted]
        await self.ctx.save(verl_checkpoints=self.announced)


async def watch_replicas(ctx: RunContext, config: TrainConfig, proc: subprocess.Popen[bytes]) -> None:
    """``replicas.ready`` once verl's ``vllm_server_*`` actors serve (they start inside verl's set-up)."""
    from services.proxy.library import ray_replica_addresses

    while proc.poll() is None:
        try:
            found = await asyncio.to_thread(
                ray_replica_addresses, config.ray_address, namespace=verl_contract.ray_namespace(ctx.run_id)
            )
        except Exception as e:  # Ray busy or restarting: look again
            log.debug("looking for verl's servers: %s", e)
            found = {}
        if found:
            ready = ReplicasReady(
                addresses=sorted(found.values()),
                dp=len(found),
                tp=config.gen_tp,
                model=config.served_model_name,
                health="ok (verl's servers)",
            )
            await ctx.emit(ready, "replicas" + ctx.key_suffix)
            return
        await asyncio.sleep(5.0)


def val_tasks(config: TrainConfig) -> list[Any]:
    if not config.val_files:
        return []
    from runctl.tasks import load_index

    tasks, errors = load_index(config.val_files).load_tasks()
    if errors:
        raise EngineError(f"VAL_FILES: {errors[0]}", phase="environment")
    return tasks


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop verl's process group: SIGTERM, then SIGKILL after ``STOP_GRACE_S``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def write_outputs(run_dir: Path, reader: Reader) -> Outcome:
    announced = sorted(reader.announced)
    hf = [str(checkpoints.published_folder(run_dir, s) / "actor" / "huggingface") for s in announced]
    summary: dict[str, Any] = {
        "run_type": "train",
        "engine": "verl",
        "steps": reader.steps.last_step,
        "checkpoints": hf,
        "last_checkpoint": hf[-1] if hf else None,
        "score_last_step": reader.last_metrics.get("critic/score/mean"),
    }
    body = {**summary, "last_step_metrics": reader.last_metrics}
    (run_dir / "summary.json").write_text(json.dumps(body, indent=2) + "\n")
    return Outcome(summary=summary, score=reader.last_metrics.get("critic/score/mean"))
