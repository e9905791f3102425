"""ENGINE=local: infer, eval and train runs on one machine or a Ray cluster, for real — Ray, vLLM replicas, the
proxy, sandboxes, agents and verifiers, and for a train run TRL's GRPO on this machine's CPU (or GPU).

Phases: environment (load the tasks, open the sandbox backend, write the resolved config) → ray (attach or start a
head, wait for NNODES) → replicas (GEN_DP vLLM servers as Ray actors) → proxy (in this process, one session per
trial) → loop (infer/eval: the trials, N_CONCURRENT at once; train: the steps, see ``trainer/loop.py``; both
resumable) → outputs (summary.csv, summary.json, the filtered index of an infer run; a train run's summary.json).
Whatever was started is stopped on the way out, whatever happened.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from runctl import bundles, layout
from runctl.bundles import SPECS, BundleError
from runctl.config import EvalConfig, InferConfig, RunConfig, TrainConfig
from runctl.config.loader import redact
from runctl.config.models import is_secret
from runctl.errors import TaskError
from runctl.events import ReplicasReady
from runctl.home import private_folder, write_atomic
from runctl.tasks import IndexEntry, Task, TaskIndex, load_index, load_task
from services.launcher.engines.base import Outcome, RunContext
from services.launcher.errors import EngineError
from services.launcher.rollout import cluster as ray_cluster
from services.launcher.rollout import replicas as vllm_replicas
from services.launcher.rollout import scores
from services.launcher.rollout.agents.installed import IN_SANDBOX, SOCKET_NAME
from services.launcher.rollout.trials import LoopSettings, TrialLoop, trial_event
from services.launcher.trainer import checkpoints
from services.launcher.trainer.loop import TrainLoop
from services.launcher.weights.base import WeightSync
from services.launcher.weights.fake import FakeSync
from services.launcher.weights.reload import VllmReload
from services.proxy.library import ProxyServer
from services.sandbox.library import CONFIG_BACKENDS, BackendSettings, TrialLimits, open_backend

log = logging.getLogger(__name__)
MODEL_FREE_AGENTS = ("oracle", "nop")


class LocalEngine:
    """See the module docstring."""

    name = "local"

    async def run(self, ctx: RunContext) -> Outcome:
        config = ctx.config
        attempt = int(ctx.progress.get("attempt", 0)) + 1
        ctx.key_suffix = "" if attempt == 1 else f".attempt{attempt}"
        await ctx.save(attempt=attempt)
        async with AsyncExitStack() as stack:
            stack.enter_context(run_log(ctx.run_dir / "logs" / "runner.log"))
            log.info("run %s (%s), attempt %d", ctx.run_id, config.run_type, attempt)
            await ctx.enter_phase("environment")
            index, entries, tasks = await asyncio.to_thread(select_tasks, config)
            settings = loop_settings(config)
            write_resolved_config(config, ctx.run_dir, ctx.secret_values)
            opened = open_backend(CONFIG_BACKENDS[config.backend], BackendSettings.of(config))
            backend, image_for = stack.enter_context(opened)
            backend = await ctx.sandboxes(stack, backend)
            ctx.check_cancelled()

            await ctx.enter_phase("ray")
            found = await asyncio.to_thread(ray_cluster.connect, config.ray_address, config.nnodes)
            stack.push_async_callback(asyncio.to_thread, ray_cluster.release)
            cluster_ready = found.ready(config.nnodes)
            await ctx.emit(cluster_ready, "cluster" + ctx.key_suffix)
            ctx.check_cancelled()

            await ctx.enter_phase("replicas")
            urls: list[str] = []
            started: list[vllm_replicas.Replica] = []
            # The key this attempt's replicas require on every request: held by its proxy and weight sync only.
            key = secrets.token_urlsafe(32)
            namespace = f"runctl-{ctx.run_id}"
            if settings.agent in MODEL_FREE_AGENTS:
                health = f"none started: AGENT_NAME={settings.agent} calls no model"
                ready = ReplicasReady(addresses=[], dp=config.gen_dp, tp=config.gen_tp, model="", health=health)
            else:
                model_still_there(config)
                started = await asyncio.to_thread(vllm_replicas.start, config, namespace, ctx.run_dir / "logs", key)
                stack.push_async_callback(asyncio.to_thread, vllm_replicas.stop, started)
                timeout = float(config.vllm_ready_timeout)
                await asyncio.to_thread(vllm_replicas.wait_ready, started, timeout, ctx.cancelled.is_set)
                ctx.check_cancelled()
                urls = [r.url for r in started]
                ready = ReplicasReady(
                    addresses=urls, dp=config.gen_dp, tp=config.gen_tp, model=config.served_model_name, health="ok"
                )
            await ctx.emit(ready, "replicas" + ctx.key_suffix)

            await ctx.enter_phase("proxy")
            proxy: ProxyServer | None = None
            if urls:
                proxy, settings = await open_proxy(stack, urls, settings, key)

            labels = {"runctl.team": ctx.team, "runctl.run": ctx.run_id}

            async def publish(record: dict[str, Any]) -> None:
                await ctx.emit(trial_event(record), f"trial.{record['task']}.{record['trial']}")
                await ctx.save()  # the count of trials published, for whoever must end the run if this runner dies

            trials_dir = trials_folder(config, ctx.run_dir)
            if isinstance(config, TrainConfig):

                def step_trials(step_tasks: list[Task], first: int) -> TrialLoop:
                    return TrialLoop(
                        step_tasks, trials_dir, settings, backend, image_for, proxy, labels, publish, first_trial=first
                    )

                sync = self.weight_sync(config, started, proxy, namespace, ctx.run_dir / "logs", key)
                train = TrainLoop(ctx, config, tasks, step_trials, sync, ctx.pinned_checkpoints, pad_id(config))
                await ctx.enter_phase("loop", total=train.plan.total_steps)
                ctx.progress_hook(ctx.num_trials, train.plan.total_steps * config.train_bsz * config.n_resp)
                try:
                    last = await train.run()
                finally:
                    if isinstance(sync, VllmReload):
                        await sync.close()
                ctx.check_cancelled()
                await ctx.enter_phase("outputs")
                return write_train_outputs(config, ctx.run_dir, last)
            loop = TrialLoop(tasks, trials_dir, settings, backend, image_for, proxy, labels, publish)
            await ctx.enter_phase("loop", total=loop.total)
            todo = await loop.recover()
            log.info("%d of %d trials already done; %d to run", len(loop.records), loop.total, len(todo))
            ctx.progress["num_trials"] = len(loop.records)
            ctx.progress_hook(len(loop.records), loop.total)
            await loop.run(todo, ctx.cancelled)
            ctx.check_cancelled()

            await ctx.enter_phase("outputs")
            log.info("all %d trials done; writing the summaries", loop.total)
            return write_outputs(config, ctx.run_dir, index, entries, loop.records, settings.n_trials)
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def weight_sync(
        config: TrainConfig,
        started: list[vllm_replicas.Replica],
        proxy: ProxyServer | None,
        namespace: str,
        log_dir: Path,
        key: str,
    ) -> WeightSync:
        """Reload in place, restarting a replica on the new weights only when its reload fails."""
        if not started:
            return FakeSync()  # no replica serves the policy (a model-free agent): nothing to sync

        async def restart(index: int, folder: Path) -> str:
            old = started[index]
            await asyncio.to_thread(vllm_replicas.stop, [old])
            on_new = config.model_copy(update={"model_path": str(folder)})
            (new,) = await asyncio.to_thread(vllm_replicas.start, on_new, namespace, log_dir, key, [index])
            started[index] = new
            await asyncio.to_thread(vllm_replicas.wait_ready, [new], float(config.vllm_ready_timeout))
            if proxy is not None:
                proxy.replace_upstream(old.url, new.url)
            return new.url

        return VllmReload([r.url for r in started], restart, key)


def model_still_there(config: RunConfig) -> None:
    """The model folder is still where the run was validated (it is read only now, by the servers).

    Raises:
        EngineError: it is gone (phase ``replicas``).
    """
    if not (Path(config.model_path) / "config.json").is_file():
        raise EngineError(
            f"MODEL_PATH {config.model_path} is gone, or has no config.json any more: it was there when the run was "
            "validated, and the vLLM servers load it only now. Fix: put the model back, then resume the run with "
            "`runctl run CONFIG --run-id RUN_ID` (finished trials are kept).",
            phase="replicas",
        )


async def open_proxy(
    stack: AsyncExitStack, urls: list[str], settings: LoopSettings, key: str
) -> tuple[ProxyServer, LoopSettings]:
    """The run's proxy in front of the replicas at ``urls`` (which require ``key``), closed with ``stack``; for an
    installed agent also the Unix socket its sandbox reaches the proxy through (in ``settings.socket_dir``, which the
    returned settings name).

    Raises:
        EngineError: the proxy could not reach every replica within 60 s.
    """
    socket_path = None
    if settings.agent in IN_SANDBOX:
        # Installed agents reach the proxy through a Unix socket bound into their sandbox.
        folder = Path(tempfile.mkdtemp(prefix="rp-", dir="/tmp"))  # short: socket paths are limited
        stack.callback(shutil.rmtree, folder, True)
        socket_path = folder / SOCKET_NAME
        settings = replace(settings, socket_dir=folder)
    proxy = ProxyServer(urls, served_model=settings.served_model, unix_socket=socket_path, upstream_key=key)
    await stack.enter_async_context(proxy)
    if socket_path is not None:
        socket_path.parent.chmod(0o755)
        socket_path.chmod(0o666)  # an agent running as any user of the sandbox may connect
    # Every replica answered /health already: wait until the proxy routes to each, so that the first sessions spread
    # over all of them rather than stick to the first one probed.
    if not await proxy.wait_ready(60, every=True):
        raise EngineError(
            "the proxy could not reach every replica within 60 s, though each answered /health. Fix: see the "
            "replicas' logs in the run folder, then resume the run.",
            phase="proxy",
        )
    return proxy, settings


@contextmanager
def run_log(path: Path) -> Iterator[None]:
    """``logs/runner.log``: what runctl's own code logs while it carries the run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logger = logging.getLogger("services")
    level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()


def loop_settings(config: RunConfig) -> LoopSettings:
    if config.scaffold not in ("terminal", "installed", *SPECS):
        raise EngineError(
            f"SCAFFOLD={config.scaffold}: this build's runner drives the terminal agent, installed agents, "
            "mini-swe-agent (mswea), Claude Code (cc), OpenCode (oc) and the OpenHands SDK (ohsdk). Fix: "
            "SCAFFOLD=installed with AGENT_COMMAND set to the command that starts that agent in the task's image.",
            phase="environment",
        )
    # A bundled scaffold has one agent (AGENT_NAME may name it, as the validator checks): the scaffold's own.
    agent = config.scaffold if config.scaffold in SPECS else config.agent_name or config.scaffold
    bundle = None
    if config.scaffold in SPECS:
        try:
            bundle = bundles.load(config.scaffold, config.agent_version, verify=True)
        except BundleError as e:
            raise EngineError(str(e), phase="environment") from e
    limits = TrialLimits(
        cpus=config.sandbox_cpus,
        memory_mb=config.sandbox_memory_mb,
        agent_network=config.agent_network,
        verifier_network=config.verifier_network,
        trial_timeout_s=float(config.trial_hard_timeout_sec) if isinstance(config, InferConfig) else None,
    )
    common: dict[str, Any] = {
        "limits": limits,
        "agent_command": config.agent_command,
        "bundle": bundle,
        "local_backend": config.backend == "local",
        "agent": agent,
        "max_turns": config.agent_max_iterations,
        "served_model": config.served_model_name,
        "sandbox_retries": config.sandbox_retries,
    }
    if isinstance(config, TrainConfig):
        # A step runs N_RESP trials of each of its tasks, AGENT_NUM_WORKERS at once, sampled at TEMPERATURE.
        return LoopSettings(
            **common,
            n_trials=config.n_resp,
            n_concurrent=config.agent_num_workers,
            temperature=config.temperature,
            agent_timeout_s=float(config.agent_timeout_sec),
            max_context_tokens=config.max_model_len or config.max_prompt + config.max_resp,
        )
    common.update(n_trials=config.n_trials, n_concurrent=config.n_concurrent)
    if isinstance(config, InferConfig):
        return LoopSettings(
            **common,
            temperature=config.temperature,
            agent_timeout_s=float(config.agent_timeout_sec),
            max_context_tokens=config.max_model_len,
        )
    return LoopSettings(
        **common,
        temperature=config.eval_temperature,
        agent_timeout_s=float(config.agent_timeout_sec),
        max_tokens=config.max_output_tokens,
        max_context_tokens=config.max_input_tokens or config.max_model_len,
    )


def select_tasks(config: RunConfig) -> tuple[TaskIndex, list[IndexEntry], list[Task]]:
    """The index and the tasks this run attempts, in index order.

    Raises:
        EngineError: the index or a task does not load, or INSTANCES_FILE names a task the index lacks.
    """
    try:
        if isinstance(config, EvalConfig):
            if config.dataset_path is None:
                raise EngineError(
                    f"DATASET_NAME={config.dataset_name}: this build has no dataset registry. Fix: set "
                    "DATASET_PATH to the task index (parquet) or task folder instead.",
                    phase="environment",
                )
            index = load_index(config.dataset_path)
            entries = index.entries[: config.n_tasks] if config.n_tasks else index.entries
        elif isinstance(config, TrainConfig):
            index = load_index(config.train_files)
            entries = index.entries
        else:
            index = load_index(config.index_file)
            entries = index.entries
            if config.instances_file:
                wanted = [w.strip() for w in Path(config.instances_file).read_text().splitlines() if w.strip()]
                by_id = {e.task_id: e for e in entries}
                missing = [w for w in wanted if w not in by_id]
                if missing:
                    raise EngineError(
                        f"INSTANCES_FILE {config.instances_file} names {len(missing)} task(s) that "
                        f"{config.index_file} lacks: {', '.join(missing[:5])}. Fix: correct the ids or the index.",
                        phase="environment",
                    )
                entries = [by_id[w] for w in dict.fromkeys(wanted)]
        tasks = [load_task(e.task_path) for e in entries]
    except (TaskError, OSError) as e:
        raise EngineError(f"the task set does not load: {e}", phase="environment") from e
    # Trials are named after the index's task ids, so two rows naming one folder stay distinct.
    tasks = [Task(t.path, t.config, e.task_id) for t, e in zip(tasks, entries, strict=True)]
    return index, entries, tasks


def trials_folder(config: RunConfig, run_dir: Path) -> Path:
    return layout.trials_folder(run_dir, config.results_dir if isinstance(config, InferConfig) else None)


def write_resolved_config(config: RunConfig, run_dir: Path, secret_values: frozenset[str] = frozenset()) -> None:
    """``config.json``: every key's value as the run used it (secrets, and secrets inside values, redacted)."""
    private_folder(run_dir)
    values = config.model_dump(by_alias=True, mode="json")
    shown = {
        k: (
            "<redacted>"
            if is_secret(config.run_type, k) and v
            else redact(v, secret_values)
            if isinstance(v, str)
            else v
        )
        for k, v in values.items()
    }
    write_atomic(run_dir / "config.json", json.dumps(shown, indent=2) + "\n")


def write_outputs(
    config: InferConfig | EvalConfig,
    run_dir: Path,
    index: TaskIndex,
    entries: list[IndexEntry],
    records: list[dict[str, Any]],
    n_trials: int,
) -> Outcome:
    """summary.csv, summary.json and (infer) the filtered index; the run's figures for ``run.succeeded``."""
    task_ids = [e.task_id for e in entries]
    per_task = scores.task_scores(sorted(records, key=lambda r: (r["task"], r["trial"])), task_ids)
    figures = scores.overall(per_task, n_trials)
    kept: set[str] = set()
    summary: dict[str, Any] = {"run_type": config.run_type, **figures}
    if isinstance(config, InferConfig):
        low, high = config.filter_min_pass_rate, config.filter_max_pass_rate
        kept = {s.task_id for s in per_task if scores.keep(s, low, high)}
        out = Path(config.output_index) if config.output_index else run_dir / "filtered.parquet"
        write_index(out, [e for e in entries if e.task_id in kept])
        summary.update({"filter": [low, high], "kept": len(kept), "filtered_index": str(out)})
    scores.write_summary_csv(run_dir / "summary.csv", per_task, kept)
    reasons: dict[str, int] = {}
    for s in per_task:
        for reason, count in s.reasons.items():
            reasons[reason] = reasons.get(reason, 0) + count
    summary["termination_reasons"] = reasons
    summary["summary_csv"] = str(run_dir / "summary.csv")
    document = {
        **summary,
        "per_task": [
            {
                "task_id": s.task_id,
                "completed": s.completed,
                "passes": s.passes,
                "errors": s.errors,
                "pass_rate": s.pass_rate,
                "mean_reward": s.mean_reward,
                "bucket": s.bucket,
                "kept": s.task_id in kept,
            }
            for s in per_task
        ],
        "index": str(index.source),
    }
    (run_dir / "summary.json").write_text(json.dumps(document, indent=2) + "\n")
    return Outcome(summary=summary, score=figures["pass@1"])


def pad_id(config: TrainConfig) -> int:
    """The token of the placeholder a trial without a model call gets (masked out): the model's pad or EOS."""
    try:
        found = json.loads((Path(config.model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    for key in ("pad_token_id", "eos_token_id"):
        value = found.get(key)
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, int):
            return value
    return 0


def write_train_outputs(config: TrainConfig, run_dir: Path, last: dict[str, Any]) -> Outcome:
    """A train run's summary.json: its steps, its published checkpoints and the last step's figures."""
    metrics = last.get("metrics", {})
    steps = checkpoints.published_steps(run_dir)
    summary: dict[str, Any] = {
        "run_type": "train",
        "steps": last.get("step", 0),
        "checkpoints": [str(checkpoints.published_folder(run_dir, s) / checkpoints.HF) for s in steps],
        "last_checkpoint": str(checkpoints.published_folder(run_dir, steps[-1]) / checkpoints.HF) if steps else None,
        "score_last_step": metrics.get("critic/score/mean"),
    }
    (run_dir / "summary.json").write_text(json.dumps({**summary, "last_step_metrics": metrics}, indent=2) + "\n")
    return Outcome(summary=summary, score=metrics.get("critic/score/mean"))


def write_index(path: Path, entries: list[IndexEntry]) -> None:
    """A task index in the input's row format: ``task_id``, ``task_path`` (absolute) and the row's other columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"task_id": e.task_id, "task_path": str(e.task_path.resolve()), **e.extra} for e in entries]
    table = (
        pa.Table.from_pylist(rows)
        if rows
        else pa.table({"task_id": pa.array([], pa.string()), "task_path": pa.array([], pa.string())})
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(path.name + ".tmp")
    pq.write_table(table, temp)
    temp.replace(path)
