"""The launcher service: admits validated runs, hands each to a carrier (``carry/``) that takes it through its
phases with its engine to exactly one end, resumes the runs a dead launcher left active, and passes cancels on.

Handlers are idempotent through the ledger; every event a run emits has a deterministic id
(``<run_id>.<key>``), and the three end events share one id, so a run ends exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

from runctl.bus import Bus, ConsumerSpec, each_event
from runctl.config.models import RunConfig, TrainConfig
from runctl.errors import ConfigError, EventError
from runctl.events import (
    CancelRequested,
    CheckpointSaved,
    ConfigValidated,
    Event,
    RunAdmitted,
    RunCancelled,
    RunFailed,
    RunQueued,
    RunSucceeded,
)
from runctl.events.payloads import RUNS_STREAM
from runctl.service import ServiceRuntime
from runctl.subjects import event_filter
from services.launcher.carry.as_job import JobCarrier
from services.launcher.carry.books import Books
from services.launcher.carry.inprocess import carry_in_process
from services.launcher.carry.rayjob import RayJobs
from services.launcher.errors import ForegroundRun, LauncherError
from services.launcher.evals import Evals, EvalStore
from services.launcher.ledger import Ledger, LedgerEntry

log = logging.getLogger(__name__)

#: Engines whose runs the launcher carries as Ray jobs on the cluster (ENGINE=fake runs in the launcher itself: it has
#: no Ray).
JOB_ENGINES = frozenset({"local", "verl"})
CONSUMER = ConsumerSpec(
    durable="launcher",
    stream=RUNS_STREAM,
    filter_subjects=[
        event_filter(name)
        for name in (
            ConfigValidated.event_name,
            CancelRequested.event_name,
            CheckpointSaved.event_name,
            RunSucceeded.event_name,
            RunFailed.event_name,
            RunCancelled.event_name,
        )
    ],
)
ENDS = (RunSucceeded, RunFailed, RunCancelled)


def resources_for(config: RunConfig) -> dict[str, float]:
    return {"nodes": float(config.nnodes), "gpus": float(config.nnodes * config.ngpus_per_node)}


class Launcher:
    """Admits validated runs and carries each to its end, as a Ray job (``carry/as_job.py``) when its engine runs on
    Ray and this launcher submits jobs, else in this process (``carry/inprocess.py``). ``on_fatal`` is called when
    the bus or the ledger stays unreachable past the retry window: the service then stops (and is restarted),
    leaving its runs active for the next launcher to resume."""

    def __init__(
        self,
        bus: Bus,
        ledger: Ledger,
        source: str,
        on_fatal: Callable[[], None] | None = None,
        jobs: RayJobs | None = None,
        evals: EvalStore | None = None,
    ) -> None:
        self.books = Books(bus, ledger, source)
        self.evals = Evals(self.books, evals) if evals is not None else None
        self.ledger = ledger
        self.on_fatal = on_fatal or (lambda: None)
        self.job_carrier = JobCarrier(self.books, jobs) if jobs is not None else None
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.cancels: dict[str, asyncio.Event] = {}
        self.cancel_by: dict[str, str] = {}

    async def handle(self, event: Event) -> None:
        if isinstance(event.data, ConfigValidated):
            await self.admit(event)
        elif isinstance(event.data, CancelRequested):
            await self.cancel(event.team, event.runid, event.data.requested_by)
        elif self.evals is not None and isinstance(event.data, CheckpointSaved):
            await self.evals.on_checkpoint(event)
        elif self.evals is not None and isinstance(event.data, ENDS):
            await self.evals.on_end(event)

    async def admit(self, event: Event) -> None:
        team, run_id = event.team, event.runid
        if run_id in self.tasks or await self.ledger.get(run_id) is not None:
            return  # already admitted, running, ended or cancelled before admission
        books = self.books
        try:
            _, config = await books.submitted_config(team, run_id)
        except ForegroundRun:
            return  # `runctl run` carries it in its own process
        except (ConfigError, LauncherError) as e:
            await books.end_failed(team, run_id, "admission", e)
            return
        # Admission control (quotas, fair share) arrives with the shared-cluster launcher; the embedded stack
        # admits every validated run at once.
        await books.publish(RunQueued(position=0, reason="embedded stack: no quota configured"), team, run_id, "queued")
        await books.publish(
            RunAdmitted(resources=resources_for(config), quota_decision="admitted: no quota configured"),
            team,
            run_id,
            "admitted",
        )
        await books.record(run_id, LedgerEntry(team=team, state="active"))
        self.start(team, run_id, config, {})
        if self.evals is not None and isinstance(config, TrainConfig):
            await self.evals.on_admitted(team, run_id, config)

    def start(self, team: str, run_id: str, config: RunConfig, progress: dict[str, Any]) -> None:
        self.cancels[run_id] = asyncio.Event()
        task = asyncio.get_running_loop().create_task(self.carry(team, run_id, config, progress))
        self.tasks[run_id] = task
        task.add_done_callback(lambda _: (self.tasks.pop(run_id, None), self.cancels.pop(run_id, None)))

    async def carry(self, team: str, run_id: str, config: RunConfig, progress: dict[str, Any]) -> None:
        cancelled = self.cancels[run_id]

        def cancelled_by() -> str:
            return self.cancel_by.get(run_id, "?")

        if self.job_carrier is not None and config.engine in JOB_ENGINES:
            await self.job_carrier.carry(team, run_id, config, progress, cancelled, cancelled_by)
            return
        evals = self.evals

        async def pinned() -> set[int]:
            return await evals.store.pinned(run_id) if evals is not None else set()

        await carry_in_process(
            self.books, team, run_id, config, progress, cancelled, cancelled_by, self.on_fatal, pinned=pinned
        )

    async def cancel(self, team: str, run_id: str, requested_by: str) -> None:
        entry = await self.ledger.get(run_id)
        if entry is not None and entry.team != team:
            log.warning("cancel of %s by team %s ignored: the run belongs to team %s", run_id, team, entry.team)
            return
        self.cancel_by[run_id] = requested_by
        if run_id in self.cancels:
            self.cancels[run_id].set()
        elif entry is None:
            try:
                await self.books.submitted_config(team, run_id)
            except ForegroundRun:
                return  # `runctl run` carries it, and hears the cancel itself
            except (ConfigError, LauncherError):
                log.warning("cancel of %s by team %s ignored: that team submitted no such run", run_id, team)
                return
            # Not admitted yet: record the cancel so a later config.validated does not start it.
            await self.books.end(team, run_id, RunCancelled(requested_by=requested_by, phase="queue"))
        elif entry.state == "active":
            await self.books.end(team, run_id, RunCancelled(requested_by=requested_by, phase="admission"))

    async def resume(self) -> None:
        """Pick up every run the ledger says is active: a previous launcher died while carrying it."""
        for run_id, entry in (await self.ledger.active()).items():
            try:
                _, config = await self.books.submitted_config(entry.team, run_id)
            except (ConfigError, LauncherError, EventError) as e:
                num_trials = int(entry.progress.get("num_trials", 0))
                await self.books.end_failed(entry.team, run_id, "admission", e, num_trials)
                continue
            log.info("resuming %s from %s", run_id, entry.progress)
            self.start(entry.team, run_id, config, entry.progress)

    async def stop(self) -> None:
        """On shutdown, leave runs active in the ledger: the next launcher resumes them."""
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


async def main(runtime: ServiceRuntime) -> None:
    assert runtime.bus is not None
    jobs = RayJobs()
    bus = runtime.bus
    launcher = Launcher(
        bus, await Ledger.open(bus), runtime.source, runtime.request_stop, jobs, await EvalStore.open(bus)
    )
    runtime.health_info(lambda: {"active_runs": sorted(launcher.tasks), "pid": os.getpid()})

    async def stop() -> None:
        await launcher.stop()
        await asyncio.to_thread(jobs.close)

    runtime.on_stop(stop)
    await launcher.resume()
    await runtime.consume(CONSUMER, each_event(launcher.handle))
