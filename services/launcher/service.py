"""The launcher service: admits validated runs, hands each to a carrier (``carry/``) that takes it through its
phases with its engine to exactly one end, resumes the runs a dead launcher left active, and passes cancels on.

Handlers are idempotent through the ledger; every event a run emits has a deterministic id
(``<run_id>.<key>``), and the three end events share one id, so a run ends exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats

from runctl import runlogins
from runctl.bus import Bus, ConsumerSpec, each_event
from runctl.callout import LoginCallout
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
from runctl.natsjwt import NKey
from runctl.service import ServiceRuntime
from runctl.subjects import event_filter
from runctl.teams import TeamRegistry
from services.launcher.admission import (
    PRIORITIES,
    RESOURCES,
    UNLIMITED,
    QueuedRun,
    Resources,
    TeamQuota,
    cluster_capacity,
    decide,
    demand_of,
    granted,
    never_fits,
)
from services.launcher.carry.as_job import JobCarrier
from services.launcher.carry.books import Books, failing_checks, retrying
from services.launcher.carry.inprocess import carry_in_process
from services.launcher.carry.rayjob import RayJobs
from services.launcher.desk import Desk
from services.launcher.errors import ForegroundRun, LauncherError
from services.launcher.evals import Evals
from services.launcher.evalstore import EvalStore
from services.launcher.ledger import Grant, Ledger, LedgerEntry, Queued
from services.launcher.settings import LauncherSettings

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


SCHEDULE_EVERY_S = 10.0
STALE_GRANT_S = 60.0


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
        settings: LauncherSettings | None = None,
    ) -> None:
        self.settings = settings or LauncherSettings.from_env()
        self.books = Books(bus, ledger, source)
        self.evals = Evals(self.books, evals, self.settings.max_evals_in_flight) if evals is not None else None
        self.ledger = ledger
        self.on_fatal = on_fatal or (lambda: None)
        self.job_carrier = JobCarrier(self.books, jobs, self.settings.run_logins) if jobs is not None else None
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.cancels: dict[str, asyncio.Event] = {}
        self.run_ends: dict[tuple[str, str], asyncio.Event] = {}
        """(team, run id) of each run carried: set when its end event reaches this launcher (its job is polled every
        second from then)."""
        self.cancel_by: dict[str, str] = {}
        self.teams = TeamRegistry(bus)
        self._scheduling = asyncio.Lock()
        self._follow_ups: set[asyncio.Task[None]] = set()
        self._stopped = False

    async def handle(self, event: Event) -> None:
        if isinstance(event.data, ConfigValidated):
            await self.admit(event)
        elif isinstance(event.data, CancelRequested):
            await self.cancel(event.team, event.runid, event.data.requested_by)
        elif self.evals is not None and isinstance(event.data, CheckpointSaved):
            await self.evals.on_checkpoint(event)
        elif isinstance(event.data, ENDS):
            if (event.team, event.runid) in self.run_ends:
                self.run_ends[(event.team, event.runid)].set()
            if self.evals is not None:
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
        fatal = await failing_checks(config)
        if fatal:
            error = LauncherError(
                f"run {run_id} has a config.validated but its config fails the validator's checks "
                f"({'; '.join(fatal)}): it is not carried. Fix: correct the config and submit it again.",
                run_id=run_id,
                team=team,
            )
            await books.end_failed(team, run_id, "admission", error)
            return
        demand = demand_of(config)
        queued = Queued(team, demand.as_dict(), PRIORITIES[config.priority], event.time.timestamp())
        await retrying(lambda: self.ledger.enqueue(run_id, queued), f"queue {run_id}")
        await self.schedule()

    async def schedule(self) -> None:
        """Admit what the policy says fits now (services/launcher/admission.py), and tell each run newly queued its
        place and why it waits. The queue and the usage come from the ledger (validated runs waiting, grants of runs
        not ended), so they survive a restart; a grant is created once, so two launchers never admit a run twice."""
        async with self._scheduling:
            waiting = await self.ledger.queued()
            if not waiting:
                return
            grants = await self.ledger.grants()
            for run_id in [r for r in waiting if r in grants]:
                await self._finish_stale(run_id, waiting[run_id], grants[run_id])
            usage: dict[str, Resources] = {}
            for grant in grants.values():
                held = Resources(*(float(grant.granted.get(r, 0.0)) for r in RESOURCES))
                usage[grant.team] = usage.get(grant.team, Resources()) + held
            queue = [
                QueuedRun(run_id, q.team, Resources(**q.demand), q.priority, q.seq)
                for run_id, q in waiting.items()
                if run_id not in grants
            ]
            quotas, capacity = await self._quotas({q.team for q in waiting.values()}), cluster_capacity(self.settings)
            for run in list(queue):
                why = never_fits(run, quotas.get(run.team), capacity)
                if why is not None:  # refused with what it asks and what there is, never queued for ever
                    queue.remove(run)
                    await self.books.end_failed(run.team, run.run_id, "admission", LauncherError(why))
                    await self.ledger.dequeue(run.run_id)
            decision = decide(queue, usage, quotas, capacity)
            for run in decision.admitted:
                await self._admit(run.run_id, waiting[run.run_id])
            for run_id, place in decision.waiting.items():
                entry = waiting[run_id]
                if not entry.announced:
                    await self.books.publish(
                        RunQueued(position=place.position, reason=place.reason), entry.team, run_id, "queued"
                    )
                    await self.ledger.announce(run_id, entry)

    async def _quotas(self, asking: set[str]) -> dict[str, TeamQuota]:
        """Each registered team's quota; with no team registered (the embedded stack), the teams ``asking`` may each
        use it all."""
        teams = await self.teams.all()
        if not teams:
            return {team: TeamQuota(UNLIMITED) for team in asking}
        return {t.name: TeamQuota(Resources(*t.limits()), t.weight) for t in teams}

    async def _admit(self, run_id: str, queued: Queued) -> None:
        team, books = queued.team, self.books
        try:
            _, config = await books.submitted_config(team, run_id)
        except (ConfigError, LauncherError) as e:
            await books.end_failed(team, run_id, "admission", e)
            return
        entry = await self.ledger.get(run_id)
        if entry is not None:  # ended while queued (cancelled), or admitted by another launcher
            await self.ledger.dequeue(run_id)
            return
        resources = granted(config)
        if not await self.ledger.grant(run_id, Grant(team, resources, time.time())):
            return  # another launcher admitted it
        if not queued.announced:
            await books.publish(RunQueued(position=0, reason="it fits now"), team, run_id, "queued")
        decision = f"admitted: within team {team}'s quota and the cluster's free capacity"
        await books.publish(RunAdmitted(resources=resources, quota_decision=decision), team, run_id, "admitted")
        await books.record(run_id, LedgerEntry(team=team, state="active"))
        await self.ledger.dequeue(run_id)
        self.start(team, run_id, config, {})
        if self.evals is not None and isinstance(config, TrainConfig):
            await self.evals.on_admitted(team, run_id, config)

    async def _finish_stale(self, run_id: str, queued: Queued, grant: Grant) -> None:
        """A grant whose run never became active: its launcher died between the two. Finish the admission."""
        if time.time() - grant.at < STALE_GRANT_S or await self.ledger.get(run_id) is not None:
            return
        await self.ledger.release(run_id)
        await self._admit(run_id, queued)

    def start(self, team: str, run_id: str, config: RunConfig, progress: dict[str, Any]) -> None:
        self.cancels[run_id] = asyncio.Event()
        self.run_ends[(team, run_id)] = asyncio.Event()
        task = asyncio.get_running_loop().create_task(self.carry(team, run_id, config, progress))
        self.tasks[run_id] = task

        def ended(_: object) -> None:
            self.tasks.pop(run_id, None)
            self.cancels.pop(run_id, None)
            self.run_ends.pop((team, run_id), None)
            if not self._stopped:
                self._spawn_schedule()  # what it held is free: the queue may move

        task.add_done_callback(ended)

    def _spawn_schedule(self) -> None:
        follow = asyncio.get_running_loop().create_task(self.schedule())
        self._follow_ups.add(follow)
        follow.add_done_callback(self._follow_ups.discard)

    async def carry(self, team: str, run_id: str, config: RunConfig, progress: dict[str, Any]) -> None:
        cancelled = self.cancels[run_id]

        def cancelled_by() -> str:
            return self.cancel_by.get(run_id, "?")

        if self.job_carrier is not None and config.engine in JOB_ENGINES:
            run_ended = self.run_ends.get((team, run_id))
            await self.job_carrier.carry(team, run_id, config, progress, cancelled, cancelled_by, run_ended)
            await self.job_carrier.ended(team, run_id)
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
            # Not admitted yet: record the cancel (which takes it off the queue) so it never starts.
            async with self._scheduling:
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
        await self.schedule()

    async def stop(self) -> None:
        """On shutdown, leave runs active in the ledger: the next launcher resumes them."""
        self._stopped = True
        for follow in list(self._follow_ups):
            follow.cancel()
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


async def main(runtime: ServiceRuntime, settings: LauncherSettings) -> None:
    assert runtime.bus is not None
    jobs = RayJobs(settings.ray_jobs_url)
    bus = runtime.bus
    launcher = Launcher(
        bus, await Ledger.open(bus), runtime.source, runtime.request_stop, jobs, await EvalStore.open(bus), settings
    )
    desk = await Desk.open(bus, launcher.books)
    await desk.start()
    callout = await open_callout(bus, settings)
    runtime.health_info(
        lambda: {
            "active_runs": sorted(launcher.tasks),
            "pid": os.getpid(),
            "desk_refused": desk.refused,
            **(
                {"logins_granted": callout.granted, "logins_refused": callout.refused, "logins_cut": callout.kicked}
                if callout
                else {}
            ),
        }
    )

    async def stop() -> None:
        if callout is not None:
            await callout.stop()
            if callout.system is not None:
                await callout.system.close()
        await desk.stop()
        await launcher.stop()
        await asyncio.to_thread(jobs.close)

    runtime.on_stop(stop)
    if settings.run_logins:
        await revoke_stale_logins(bus, launcher.ledger)
    await launcher.resume()
    # Quotas changed, another launcher's runs ended: look again now and then, until the service stops.
    runtime.spawn(_every(SCHEDULE_EVERY_S, launcher.schedule, runtime.stopping))
    await runtime.consume(CONSUMER, each_event(launcher.handle))


async def open_callout(bus: Bus, settings: LauncherSettings) -> LoginCallout | None:
    """The bus's auth callout for run logins, answered here when the launcher holds its issuer's seed."""
    if settings.run_login_seed_file is None:
        return None
    system = None
    if settings.bus_system_url:
        system = await nats.connect(settings.bus_system_url, name="runctl-launcher-system", max_reconnect_attempts=-1)
    callout = LoginCallout(bus, NKey.load(settings.run_login_seed_file), system)
    await callout.start()
    log.info(
        "answering the bus's auth callout for run logins as %s (%s)",
        callout.issuer.public,
        "revoked logins' connections are closed" if system else "no system login: revoked logins' connections stay",
    )
    return callout


async def revoke_stale_logins(bus: Bus, ledger: Ledger) -> int:
    """Revoke the login of every run that is not active (a launcher that died between a run's end and the revoke
    leaves one behind); returns how many."""
    stale = 0
    for user in await runlogins.current(bus):
        entry = await ledger.get(user.run_id)
        if entry is None or entry.state != "active" or entry.team != user.team:
            await runlogins.revoke(bus, user.team, user.run_id)
            stale += 1
    if stale:
        log.info("revoked %d login(s) of runs that ended while no launcher ran", stale)
    return stale


async def _every(seconds: float, action: Callable[[], Awaitable[None]], stopping: asyncio.Event) -> None:
    while not stopping.is_set():
        try:
            await asyncio.wait_for(stopping.wait(), seconds)
            return
        except TimeoutError:
            pass
        try:
            await action()
        except Exception as e:  # the next round tries again
            log.warning("admission round failed: %s: %s", type(e).__name__, e)
