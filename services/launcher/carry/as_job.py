"""Carrying a run as a Ray job: the launcher submits the runner (``carry/job_main.py``) through the Jobs API, or
finds the one still running after a launcher restart, and watches it to its end. The runner publishes the run's
events and its end. A runner that ends without ending the run (it crashed, or died with its node) is submitted
again, up to ``MAX_RETRIES`` times, and resumes where the last one stopped; after that the run fails with the last
job's log tail and the number of attempts."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from runctl import runlogins
from runctl.config.models import RunConfig
from runctl.errors import BusError
from runctl.events import RunCancelled
from runctl.home import home
from services.launcher.carry.books import RETRY_WINDOW_S, Books, retrying
from services.launcher.carry.rayjob import TERMINAL, RayJobs
from services.launcher.errors import LauncherError
from services.launcher.ledger import LedgerEntry

log = logging.getLogger(__name__)

#: How often a running job's status is asked of Ray's jobs server: every JOB_IDLE_POLL_S while the run goes on (a
#: runner that dies without ending the run is seen that late), every JOB_POLL_S once the run's end event came or it is
#: being cancelled, so that its job's own end is seen at once. Asked every second throughout, the launcher's polling
#: was a tenth of its CPU in the demo, and as much again in the head's dashboard, for every run it carried.
JOB_POLL_S = 1.0
JOB_IDLE_POLL_S = 5.0
#: The launcher's environment a runner job is given (besides RUNCTL_NATS_URL and RUNCTL_HOME, always set).
RUNNER_ENV = (
    "RUNCTL_SITE_ENV",
    "RUNCTL_LOG_LEVEL",
    "RUNCTL_NODES_TIMEOUT_SEC",
    "RUNCTL_TEAM_PATHS",  # the team's folders (the runner checks again just before launch)
    # Its sandboxes are booked as the sandbox service's are: the same caps, scope and cgroup parent.
    "RUNCTL_SANDBOX_CAPS",
    "RUNCTL_SANDBOX_DEFAULT_CAP",
    "RUNCTL_SANDBOX_SCOPE",
    "RUNCTL_SANDBOX_CGROUP",
)


class JobCarrier:
    """Carries runs as Ray jobs. With ``run_logins`` each runner connects with its run's own bus login, issued before
    it is submitted and revoked once the run has ended (``runctl.runlogins``); without, with the launcher's."""

    def __init__(self, books: Books, jobs: RayJobs, run_logins: bool = False) -> None:
        self.books = books
        self.jobs = jobs
        self.run_logins = run_logins

    async def ended(self, team: str, run_id: str) -> None:
        """The run has ended: take its login back (not called when the launcher stops meanwhile: the runner goes on,
        and the next launcher finds it)."""
        if self.run_logins:
            await retrying(lambda: runlogins.revoke(self.books.bus, team, run_id), f"revoke the login of {run_id}")

    async def carry(
        self,
        team: str,
        run_id: str,
        config: RunConfig,
        progress: dict[str, Any],
        cancelled: asyncio.Event,
        cancelled_by: Callable[[], str],
        run_ended: asyncio.Event | None = None,
    ) -> None:
        """Carry the run to its end. ``run_ended`` is set when the run's end event reaches the launcher (its job is
        about to end too); without it, the job's status is asked every ``JOB_POLL_S``."""
        books, most = self.books, config.max_retries + 1
        while True:
            attempt = int(progress.get("job_attempt", 0))
            try:
                submission, progress = await self.find_or_submit(team, run_id, progress, config.venv_path)
                attempt = int(progress["job_attempt"])
                status, stop_sent = await self.watch(run_id, submission, cancelled, run_ended)
            except LauncherError as e:
                await books.end_failed(team, run_id, "environment", e, int(progress.get("num_trials", 0)), attempt or 1)
                return
            entry = await books.ledger.get(run_id)
            if entry is not None and entry.state == "ended":
                return
            progress = entry.progress if entry else progress
            phase, saved = progress.get("phase", "environment"), int(progress.get("num_trials", 0))
            if stop_sent:
                trials = await books.published_trials(team, run_id, saved)
                await books.end(team, run_id, RunCancelled(requested_by=cancelled_by(), phase=phase, num_trials=trials))
                return
            tail = await asyncio.to_thread(self.jobs.log_tail, submission)
            if attempt < most:
                log.warning(
                    "%s: its runner (Ray job %s) ended %s in phase %s without ending the run; starting runner %d of %d",
                    run_id,
                    submission,
                    status,
                    phase,
                    attempt + 1,
                    most,
                )
                continue
            error = LauncherError(
                f"the run's runner died {attempt} time(s) without ending the run (MAX_RETRIES={config.max_retries}: "
                f"{most} attempt(s) in all); the last, Ray job {submission}, ended {status}. Its log ends:\n{tail}\n"
                "Fix: see the runner's log and logs/runner.log in the run folder; then submit the run again.",
                run_id=run_id,
                team=team,
            )
            await books.end_failed(
                team, run_id, phase, error, await books.published_trials(team, run_id, saved), attempt
            )
            return

    async def find_or_submit(
        self, team: str, run_id: str, progress: dict[str, Any], venv: str | None = None
    ) -> tuple[str, dict[str, Any]]:
        """The run's live runner job, else a new one (its attempt number counted in the ledger first).

        Raises:
            LauncherError: the jobs server cannot be reached or refuses the job.
        """
        live = [sid for sid, status in await asyncio.to_thread(self.jobs.find, run_id) if status not in TERMINAL]
        if live:
            log.info("%s: watching its running job %s", run_id, live[-1])
            return live[-1], {**progress, "job_attempt": int(progress.get("job_attempt", 1))}
        attempt = int(progress.get("job_attempt", 0)) + 1
        progress = {**progress, "job_attempt": attempt}
        await self.books.record(run_id, LedgerEntry(team=team, state="active", progress=progress))
        env = self.job_env(await self.runner_bus_url(team, run_id))
        submission = await asyncio.to_thread(self.jobs.submit, team, run_id, attempt, env, venv)
        log.info("%s: submitted as Ray job %s", run_id, submission)
        return submission, progress

    async def watch(
        self, run_id: str, submission: str, cancelled: asyncio.Event, run_ended: asyncio.Event | None = None
    ) -> tuple[str, bool]:
        """Poll the job until it ends, stopping it if the run is cancelled; returns (final status, stop sent). Every
        ``JOB_IDLE_POLL_S`` while neither ``cancelled`` nor ``run_ended`` is set (either wakes it), every
        ``JOB_POLL_S`` after; every ``JOB_POLL_S`` throughout without ``run_ended``.

        Raises:
            LauncherError: the jobs server stayed unreachable for the retry window.
        """
        status, stop_sent, failing_since = "PENDING", False, None
        signals = [cancelled] if run_ended is None else [cancelled, run_ended]
        while status not in TERMINAL:
            try:
                if cancelled.is_set() and not stop_sent:
                    await asyncio.to_thread(self.jobs.stop, submission)
                    stop_sent = True
                unset = [signal for signal in signals if not signal.is_set()]
                idle = run_ended is not None and len(unset) == len(signals)
                await first_set(unset, JOB_IDLE_POLL_S if idle else JOB_POLL_S)
                status = await asyncio.to_thread(self.jobs.status, submission)
                failing_since = None
            except LauncherError:
                raise
            except Exception as e:  # the Jobs SDK raises RuntimeError, ConnectionError … while the head restarts
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > RETRY_WINDOW_S:
                    raise LauncherError(
                        f"the Ray jobs server stopped answering about job {submission} for {RETRY_WINDOW_S:.0f}s "
                        f"({type(e).__name__}: {e}). Fix: check the Ray head.",
                        run_id=run_id,
                    ) from e
                log.warning("job %s: %s: %s; asking again", submission, type(e).__name__, e)
                await asyncio.sleep(JOB_POLL_S)
        return status, stop_sent

    async def runner_bus_url(self, team: str, run_id: str) -> str:
        """The bus URL a new runner of the run connects with: with its run's fresh login once the bus accepts it,
        else the launcher's own.

        Raises:
            LauncherError: the bus did not take the login in time.
        """
        url = self.books.bus.url
        if not self.run_logins:
            return url
        login = await runlogins.issue(self.books.bus, team, run_id)
        try:
            await runlogins.wait_accepted(url, login)
        except BusError as e:
            raise LauncherError(e.message, run_id=run_id, team=team) from e
        return login.url(url)

    def job_env(self, bus_url: str) -> dict[str, str]:
        """What a runner job needs, and nothing more: the bus it publishes on (``bus_url``, with its run's login),
        the runctl home, and the few settings the runner itself reads. The launcher's own login and its other secrets
        (the database URL, the proxy's admin token, another service's settings) stay out of the job's environment,
        which Ray shows to anyone who can list jobs."""
        env = {k: v for k, v in os.environ.items() if k in RUNNER_ENV}  # passed on as they are: the job reads them
        env["RUNCTL_NATS_URL"] = bus_url
        env["RUNCTL_HOME"] = str(home())
        return env


async def first_set(events: list[asyncio.Event], timeout_s: float) -> None:
    """Return once one of ``events`` is set, or after ``timeout_s`` (at once if one is set already)."""
    if not events:
        await asyncio.sleep(timeout_s)
        return
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
