"""What a verl agent-loop worker process needs to run runctl trials: the run's config, a sandbox backend, the proxy
in front of verl's own vLLM servers, and the trial loop that infer and eval runs use.

verl builds an agent loop object per sample, many per process; they share one ``TrialHost`` per run folder, made on
first use inside the worker's event loop. The proxy finds verl's servers as the ``vllm_server_*`` Ray actors (the
names verl gives them) unless upstream URLs are given (tests, and a cluster whose servers are reached otherwise).

A trial's number is claimed by creating its folder (``trials/<task>/trial-<k>``; ``mkdir`` is atomic, also on a
shared filesystem), so workers on many nodes, and a trainer resumed after a crash, never reuse one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runctl.config import TrainConfig
from runctl.config.models import is_secret
from runctl.events.payloads import Payload
from runctl.layout import trial_folder
from runctl.tasks import Task, load_task
from services.launcher.errors import EngineError
from services.launcher.rollout.trials import LoopSettings, TrialLoop
from services.launcher.settings import LauncherSettings
from services.proxy.library import ProxyServer
from services.sandbox.library import CONFIG_BACKENDS, Backend, BackendSettings, open_backend

log = logging.getLogger(__name__)
CONFIG_FILE = Path("verl") / "runctl_config.json"
RUN_FILE = Path("verl") / "runctl_run.json"
WORKER_SOURCE = "/launcher/verl-worker"
READY_TIMEOUT_S = 300.0


def write_config(config: TrainConfig, run_dir: Path, run_id: str) -> Path:
    """The run's config for the workers (secrets left out: no trial needs them), and its id."""
    values = {k: v for k, v in config.model_dump(mode="json").items() if not is_secret("train", k)}
    path = run_dir / CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(values, indent=1))
    (run_dir / RUN_FILE).write_text(json.dumps({"run_id": run_id}))
    return path


def read_config(run_dir: Path) -> TrainConfig:
    return TrainConfig.model_validate(json.loads((run_dir / CONFIG_FILE).read_text()))


def read_run_id(run_dir: Path) -> str:
    try:
        return str(json.loads((run_dir / RUN_FILE).read_text())["run_id"])
    except FileNotFoundError:
        return run_dir.name  # a folder prepared before the id was written there


@dataclass
class TrialOutcome:
    task: Task
    number: int
    record: dict[str, Any]
    trajectory: dict[str, Any] | None


class TrialHost:
    """See the module docstring. ``get`` returns the one host of a run folder in this process."""

    _hosts: dict[Path, TrialHost] = {}
    _lock: asyncio.Lock | None = None

    def __init__(self, run_dir: Path, config: TrainConfig, upstreams: list[str] | None) -> None:
        self.run_dir = run_dir
        self.config = config
        self.upstreams = upstreams
        self.trials_dir = run_dir / "trials"
        self.run_id = read_run_id(run_dir)
        self._stack = ExitStack()
        self._astack = AsyncExitStack()
        self._tasks: dict[str, Task] = {}
        self.proxy: ProxyServer | None = None
        self.loop: TrialLoop | None = None
        self._loops: dict[float, TrialLoop] = {}

    @classmethod
    async def get(cls, run_dir: Path, upstreams: list[str] | None = None) -> TrialHost:
        if cls._lock is None:
            cls._lock = asyncio.Lock()
        async with cls._lock:
            host = cls._hosts.get(run_dir)
            if host is None:
                host = cls(run_dir, await asyncio.to_thread(read_config, run_dir), upstreams)
                await host.start()
                cls._hosts[run_dir] = host
            return host

    @classmethod
    async def close_all(cls) -> None:
        for host in list(cls._hosts.values()):
            await host.close()
        cls._hosts.clear()
        cls._lock = None  # bound to this event loop

    async def start(self) -> None:
        from services.launcher.engines.local import loop_settings  # the same trial settings as a local run's

        config = self.config
        settings: LoopSettings = loop_settings(config)
        backend, image_for = self._stack.enter_context(
            open_backend(CONFIG_BACKENDS[config.backend], BackendSettings.of(config))
        )
        backend = await self._book(backend)
        # verl's fully async trainer pauses its servers for each weight update, cutting short what they generate:
        # the proxy sends such a request again, so the agent never sees it (and a turn has one policy version).
        self.proxy = ProxyServer(
            self.upstreams or (),
            served_model=None,
            discover_ray=not self.upstreams,
            ray_address=None,
            ray_namespace=self.namespace(),
            resend_aborted=True,
            upstream_key=LauncherSettings.from_env().replica_key,  # verl's servers require it
        )
        await self.proxy.start()
        # verl's servers are up before its first rollout; a replica the proxy has not yet probed would answer 503.
        if not await self.proxy.wait_ready(READY_TIMEOUT_S):
            where = ", ".join(self.upstreams or []) or "no vllm_server_* Ray actor answered"
            raise EngineError(
                f"runctl's proxy found no healthy vLLM server of verl's within {READY_TIMEOUT_S:.0f} s ({where}). Fix: "
                "see verl's log (logs/verl.log in the run folder) for why its servers did not start.",
                phase="loop",
            )
        self._parts = (backend, image_for, {"runctl.team": config.team, "runctl.run": self.run_id})
        self._settings = settings
        self.loop = self._make(settings)
        self._loops[settings.temperature] = self.loop

    async def _book(self, backend: Backend) -> Backend:
        """``backend`` booked in the sandbox ledger (team caps, owner, the reaper after a crash, sandbox events) when
        the runner handed the workers its bus (``RUNCTL_NATS_URL`` in their runtime environment), as a runner books
        its own trials' sandboxes; ``backend`` itself for a run without a bus (a foreground run)."""
        url = LauncherSettings.from_env().nats_url
        if not url:
            return backend
        from runctl.bus import Bus
        from runctl.events import new_event
        from services.sandbox.library import booked

        bus = await Bus.connect(url, name=f"runctl-verl-worker-{self.run_id}", reconnect=True, as_team=False)
        self._astack.push_async_callback(bus.close)
        team, run_id = self.config.team, self.run_id

        async def emit(payload: Payload, key: str) -> None:
            event_id = f"{run_id}.{key}"  # the runner's scheme: a repeat is dropped by the bus
            await bus.publish(new_event(payload, team=team, run_id=run_id, source=WORKER_SOURCE, event_id=event_id))

        return await self._astack.enter_async_context(booked(backend, bus, team, run_id, emit))

    def _make(self, settings: LoopSettings) -> TrialLoop:
        backend, image_for, labels = self._parts
        return TrialLoop([], self.trials_dir, settings, backend, image_for, self.proxy, labels, _unused)

    def loop_for(self, temperature: float | None) -> TrialLoop:
        """The trial loop of samples drawn at ``temperature`` (what verl asks for: TEMPERATURE while training,
        VAL_TEMPERATURE in its validation, whose agents get VAL_AGENT_TIMEOUT_SEC)."""
        t = self.config.temperature if temperature is None else float(temperature)
        if t not in self._loops:
            timeout = self.config.agent_timeout_sec
            if t == self.config.val_temperature and t != self.config.temperature:
                timeout = self.config.val_agent_timeout_sec
            self._loops[t] = self._make(replace(self._settings, temperature=t, agent_timeout_s=float(timeout)))
        return self._loops[t]

    async def close(self) -> None:
        if self.proxy is not None:
            await self.proxy.close()
        for loop in self._loops.values():
            loop.executor.shutdown(wait=False)
            loop.http.close()
        self._stack.close()
        await self._astack.aclose()

    async def weight_version(self) -> int | None:
        """The newest weight version verl's servers serve (verl's ``global_steps``); None when they are not Ray
        actors of verl's (server URLs given, as in tests)."""
        if self.upstreams:
            return None
        from services.proxy.library import ray_weight_versions

        versions = await asyncio.to_thread(ray_weight_versions, namespace=self.namespace())
        return max(versions) if versions else None

    def namespace(self) -> str | None:
        """The Ray namespace of verl's job (its servers are named actors there; the runner names it,
        ``runctl.verl.ray_namespace``), so that another run's ``vllm_server_*`` on the same cluster is never taken
        for one of this run's; None outside Ray (server URLs given, as in tests)."""
        if self.upstreams:
            return None
        import ray

        return str(ray.get_runtime_context().namespace) if ray.is_initialized() else None

    def task(self, path: str) -> Task:
        if path not in self._tasks:
            self._tasks[path] = load_task(path)
        return self._tasks[path]

    def claim(self, task: Task) -> int:
        """The next trial number of ``task`` not taken by any worker (its folder is created here)."""
        k = 0
        while True:
            folder = trial_folder(self.trials_dir, task.id, k)
            folder.parent.mkdir(parents=True, exist_ok=True)
            try:
                folder.mkdir()
                return k
            except FileExistsError:
                k += 1

    async def run_trial(self, task_path: str, temperature: float | None = None) -> TrialOutcome:
        """One trial of the task at ``task_path``: sandbox, agent through the proxy (sampling at ``temperature``),
        verifier."""
        task = await asyncio.to_thread(self.task, task_path)
        number = await asyncio.to_thread(self.claim, task)
        record = await self.loop_for(temperature).trial(task, number)
        folder = trial_folder(self.trials_dir, task.id, number)
        trajectory_path = folder / "trajectory.json"
        trajectory = json.loads(trajectory_path.read_text()) if trajectory_path.is_file() else None
        return TrialOutcome(task, number, record, trajectory)


async def _unused(record: dict[str, Any]) -> None:  # the agent loop hands trials on through the outbox
    raise AssertionError("TrialHost publishes through the outbox")
