"""The loop of infer and eval runs: every (task, attempt) pair is one trial, N_CONCURRENT in flight.

A trial's folder is ``<trials dir>/<task>/trial-<k>/``: ``result.json`` (the sandbox's verdict), ``logs/`` (the
sandbox's ``/logs``: agent and verifier output), ``agent/terminal.jsonl``, ``trajectory.json`` (what the proxy
captured) and, last, ``trial.json`` — the runner's record, written atomically. Then ``trial.finished`` is
published and a ``published`` marker written. On resume, a trial with ``trial.json`` is done (published now if its
marker is missing: the event id is deterministic, so a repeat is dropped); a folder without it was cut short and
is run again from scratch. So no trial is lost and none is counted twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from runctl.bundles import Bundle
from runctl.events import TrialFinished
from runctl.home import write_atomic
from runctl.layout import TRAJECTORY, TRIAL_RECORD, trial_folder
from runctl.tasks import Task
from services.launcher.errors import EngineError
from services.launcher.rollout.agents.bundled import Budget, BundledAgent
from services.launcher.rollout.agents.claude_code import ClaudeCodeAgent
from services.launcher.rollout.agents.installed import IN_SANDBOX, InstalledAgent
from services.launcher.rollout.agents.mswea import MsweaAgent
from services.launcher.rollout.agents.ohsdk import OpenHandsSdkAgent
from services.launcher.rollout.agents.opencode import OpenCodeAgent
from services.launcher.rollout.agents.terminal import TerminalAgent, trial_seed
from services.proxy.library import ProxyServer, captured_usage
from services.sandbox.library import Agent, Backend, TrialLimits, TrialRunner, make_agent

log = logging.getLogger(__name__)
#: The scaffolds whose agent comes in a bundle (runctl.bundles), each started the same way.
BUNDLED: dict[str, Callable[[Bundle, str, str, Path, Budget], BundledAgent]] = {
    "mswea": MsweaAgent,
    "cc": ClaudeCodeAgent,
    "oc": OpenCodeAgent,
    "ohsdk": OpenHandsSdkAgent,
}
RECORD = TRIAL_RECORD
PUBLISHED = "published"


@dataclass(frozen=True)
class LoopSettings:
    """What the loop needs from the config, the same for infer and eval."""

    n_trials: int
    n_concurrent: int
    temperature: float
    agent: str
    max_turns: int
    agent_timeout_s: float
    served_model: str
    sandbox_retries: int
    max_tokens: int | None = None
    max_context_tokens: int | None = None
    agent_command: str | None = None
    bundle: Bundle | None = None
    """The scaffold's agent bundle (SCAFFOLD=mswea, cc, oc or ohsdk), verified when the run started."""
    socket_dir: Path | None = None
    """Where the proxy's Unix socket is (installed agents reach the proxy through it)."""
    local_backend: bool = True
    limits: TrialLimits = TrialLimits()
    """SANDBOX_CPUS, SANDBOX_MEMORY_MB, AGENT_NETWORK, VERIFIER_NETWORK and TRIAL_HARD_TIMEOUT_SEC."""


class TimedBackend:
    """A backend whose calls are timed: the seconds a trial spends in its sandbox."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self.seconds = 0.0
        self.name = backend.name

    def __getattr__(self, attribute: str) -> Any:
        target = getattr(self._backend, attribute)
        if not callable(target):
            return target

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return target(*args, **kwargs)
            finally:
                self.seconds += time.monotonic() - started

        return timed


Publish = Callable[[dict[str, Any]], Awaitable[None]]


class TrialLoop:
    def __init__(
        self,
        tasks: list[Task],
        trials_dir: Path,
        settings: LoopSettings,
        backend: Backend,
        image_for: Callable[[Task], str | None],
        proxy: ProxyServer | None,
        labels: dict[str, str],
        publish: Publish,
        first_trial: int = 0,
    ) -> None:
        """``first_trial``: the number of each task's first trial here (a train run's step ``s`` numbers its trials
        from ``(s - 1) × N_RESP``, so that every trial of a run has its own folder and event)."""
        self.tasks = tasks
        self.first_trial = first_trial
        self.trials_dir = trials_dir
        self.settings = settings
        self.backend = backend
        self.image_for = image_for
        self.proxy = proxy
        self.labels = labels
        self.publish = publish
        self.records: list[dict[str, Any]] = []
        self.executor = ThreadPoolExecutor(max_workers=settings.n_concurrent, thread_name_prefix="trial")
        # One HTTP client for the agents of every trial (making one costs tens of milliseconds); its pool holds a
        # connection per trial in flight.
        self.http = httpx.Client(timeout=None, limits=httpx.Limits(max_connections=None))

    def pairs(self) -> Iterator[tuple[Task, int]]:
        for task in self.tasks:
            for k in range(self.first_trial, self.first_trial + self.settings.n_trials):
                yield task, k

    @property
    def total(self) -> int:
        return len(self.tasks) * self.settings.n_trials

    async def recover(self) -> list[tuple[Task, int]]:
        """Publish finished-but-unpublished trials, clear cut-short ones; return the trials still to run."""
        todo = []
        for task, k in self.pairs():
            folder = trial_folder(self.trials_dir, task.id, k)
            record_path = folder / RECORD
            if record_path.is_file():
                record = json.loads(record_path.read_text())
                if not (folder / PUBLISHED).exists():
                    await self.publish(record)
                    (folder / PUBLISHED).touch()
                self.records.append(record)
            else:
                if folder.exists():
                    shutil.rmtree(folder)
                todo.append((task, k))
        for owned in await asyncio.to_thread(self.backend.list_owned, self.labels):
            await asyncio.to_thread(self.backend.destroy_owned, owned)  # a sandbox a killed runner left behind
        return todo

    async def run(self, todo: list[tuple[Task, int]], cancelled: asyncio.Event) -> None:
        """Run the trials; after a cancel or a failure no new trial starts, and those in flight finish first.

        Raises:
            EngineError: the model stopped answering (the trial it cut short is not recorded: a resume runs it).
        """
        gate = asyncio.Semaphore(self.settings.n_concurrent)
        failed = asyncio.Event()

        async def one(task: Task, k: int) -> None:
            async with gate:
                if cancelled.is_set() or failed.is_set():
                    return
                try:
                    record = await self.trial(task, k)
                except BaseException:
                    failed.set()
                    raise
                folder = trial_folder(self.trials_dir, task.id, k)
                await self.publish(record)
                (folder / PUBLISHED).touch()
                self.records.append(record)

        try:
            outcomes = await asyncio.gather(*(one(task, k) for task, k in todo), return_exceptions=True)
        finally:
            self.executor.shutdown(wait=False)
            self.http.close()
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def trial(self, task: Task, k: int) -> dict[str, Any]:
        started = time.monotonic()
        folder = trial_folder(self.trials_dir, task.id, k)
        loop = asyncio.get_running_loop()
        attempts = 0
        while True:
            # An agent in the sandbox counts its own turns, each scaffold in its way (OpenCode's step limit is advice
            # to the model): its session answers AGENT_MAX_ITERATIONS of the policy's calls and refuses the next.
            max_turns = self.settings.max_turns if self.settings.agent in IN_SANDBOX else None
            session = self.proxy.open_session({"task": task.id, "trial": k}, max_turns) if self.proxy else None
            agent = self._agent(task, k, folder, session.openai_base_url if session else "")
            timed = TimedBackend(self.backend)
            labels = {**self.labels, "runctl.trial": f"{task.id}/{k}"}
            runner = TrialRunner(timed, self.image_for, self.settings.limits)
            try:
                result = await loop.run_in_executor(self.executor, runner.run, task, agent, folder, labels)
            finally:
                trajectory = await self.proxy.close_session(session.id) if self.proxy and session else None
            if result.termination_reason != "env_setup_failed" or attempts >= self.settings.sandbox_retries:
                break
            attempts += 1
            shutil.rmtree(folder, ignore_errors=True)
        if getattr(agent, "model_unavailable", False):
            shutil.rmtree(folder, ignore_errors=True)
            why = result.failure.message if result.failure else "no answer"
            raise EngineError(
                f"the model stopped answering during trial {k} of {task.id} ({why}); the trials finished so far are "
                "kept. Fix: check the replicas' logs in the run folder, then resume the run.",
                phase="loop",
            )
        if trajectory is not None:
            (folder / TRAJECTORY).write_bytes(orjson.dumps(trajectory))
        termination, failure = result.termination_reason, result.failure.model_dump() if result.failure else None
        if trajectory and trajectory.get("refused_over_budget") and termination in ("agent_completed", "error"):
            # It asked for a turn past its budget and was refused (its own ending is that refusal, or what it
            # made of it): it ran out of turns.
            termination, failure = "max_turns", None
        turns, tokens = getattr(agent, "turns", 0), dict(getattr(agent, "tokens", {}))
        model_s = getattr(agent, "model_seconds", 0.0)
        if self.settings.agent in IN_SANDBOX and trajectory is not None:  # it calls the proxy itself: count the capture
            usage = captured_usage(trajectory)
            turns, model_s = usage.turns, usage.model_s
            tokens = {"prompt": usage.prompt_tokens, "completion": usage.completion_tokens}
        sandbox_s = timed.seconds  # every backend call, the agent's commands included
        wall = time.monotonic() - started
        record: dict[str, Any] = {
            "task": task.id,
            "trial": k,
            "reward": result.reward if result.reward_valid else None,
            "rewards": result.rewards,
            "termination_reason": termination,
            "failure": failure,
            "agent": agent.name,
            "turns": turns,
            "tokens": tokens,
            "sandbox_retries": attempts,
            "durations_s": {
                **{k2: round(v, 4) for k2, v in result.timings_s.items()},
                "model": round(model_s, 4),
                "sandbox": round(sandbox_s, 4),
                "wall": round(wall, 4),
            },
            "session": session.id if session else None,
        }
        if self.settings.bundle is not None:
            record["bundle"] = self.settings.bundle.record()
        log.info("%s #%d: reward %s (%s) in %.2f s", task.id, k, record["reward"], termination, wall)
        write_atomic(folder / RECORD, json.dumps(record, indent=2))
        return record

    def _agent(self, task: Task, k: int, folder: Path, base_url: str) -> Agent:
        s = self.settings
        if s.agent in ("oracle", "nop"):
            return make_agent(s.agent)
        if s.agent in IN_SANDBOX:  # reaches its session through the relay: by its path, on the relay's address
            assert s.socket_dir
            session_path = urlsplit(base_url).path.removesuffix("/v1")
            if s.agent in BUNDLED:
                assert s.bundle is not None
                budget = Budget(s.max_turns, s.temperature, s.max_tokens, s.max_context_tokens)
                return BUNDLED[s.agent](s.bundle, session_path, s.served_model, s.socket_dir, budget)
            assert s.agent_command
            return InstalledAgent(
                s.agent_command, session_path, s.served_model, s.socket_dir, sys.executable, s.local_backend
            )
        return TerminalAgent(
            base_url,
            s.served_model,
            folder / "agent",
            max_turns=s.max_turns,
            timeout_s=s.agent_timeout_s,
            temperature=s.temperature,
            seed=trial_seed(task.id, k),
            max_tokens=s.max_tokens,
            max_context_tokens=s.max_context_tokens,
            http=self.http,
        )


def trial_event(record: dict[str, Any]) -> TrialFinished:
    durations = {k: float(v) for k, v in record.get("durations_s", {}).items()}
    return TrialFinished(
        task=record["task"],
        trial=record["trial"],
        reward=record["reward"],
        termination_reason=record["termination_reason"],
        durations_s=durations,
        tokens={k: int(v) for k, v in record.get("tokens", {}).items()},
    )
