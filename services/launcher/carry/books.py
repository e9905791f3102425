"""A run's books: its events on the bus and its entry in the launcher's ledger, written with retries through a
short outage. The launcher and the runner job both keep them; every event id is deterministic
(``<run_id>.<key>``) and the three end events share one, so a retry never records anything twice and a run ends
exactly once."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import nats.errors
import nats.js.errors

from runctl.bus import Bus, desk
from runctl.config.loader import submitted_values, validate_settings
from runctl.config.models import RunConfig
from runctl.errors import BusError, RunctlError
from runctl.events import ConfigSubmitted, TrialFinished, new_event, parse_event
from runctl.events.payloads import RUNS_STREAM, TRIALS_STREAM, Payload
from runctl.subjects import event_subject, team_stream
from services.launcher.carry.lifecycle import failed
from services.launcher.errors import ForegroundRun, LauncherError
from services.launcher.evalstore import EvalEntry, EvalStore, eval_run_id
from services.launcher.ledger import Ledger, LedgerEntry

log = logging.getLogger(__name__)

RETRY_WINDOW_S = 60.0


class RunBooks:
    """What carrying a run writes and reads outside its engine: its events, its ledger entry, its checkpoints' evals.
    :class:`Books` keeps them in the services' buckets (the launcher); :class:`DeskBooks` asks the launcher's desk
    (a runner, whose bus login reaches nothing else)."""

    def __init__(self, bus: Bus, source: str) -> None:
        self.bus = bus
        self.source = source

    async def publish(self, payload: Payload, team: str, run_id: str, key: str) -> None:
        """Publish with retries: the id is deterministic, so a retry can never record an event twice."""
        event = new_event(payload, team=team, run_id=run_id, source=self.source, event_id=f"{run_id}.{key}")
        await retrying(lambda: self.bus.publish(event), f"publish {event.name} of {run_id}")

    async def end(self, team: str, run_id: str, payload: Payload) -> None:
        await self.publish(payload, team, run_id, "end")
        await self.close(team, run_id, payload.event_name)
        log.info("%s %s", run_id, payload.event_name)

    async def end_failed(
        self, team: str, run_id: str, phase: str, error: RunctlError, num_trials: int = 0, attempts: int = 1
    ) -> None:
        await self.end(team, run_id, failed(phase, error, num_trials, attempts))

    async def entry(self, run_id: str) -> LedgerEntry | None:
        raise NotImplementedError

    async def record(self, run_id: str, entry: LedgerEntry) -> None:
        raise NotImplementedError

    async def close(self, team: str, run_id: str, outcome: str) -> None:
        """The ledger's part of a run's end (after its end event): the entry ended, what it held given back."""
        raise NotImplementedError

    async def published_trials(self, team: str, run_id: str, known: int = 0) -> int:
        """How many of the run's trials are on the bus (distinct ids): what the end event of a run whose runner died
        must count, since a runner killed between publishing a trial and saving its progress saved one too few.
        ``known`` (the saved count) when the bus cannot say."""
        raise NotImplementedError

    async def last_event(self, team: str, run_id: str, name: str) -> bytes | None:
        """The body of the run's last event called ``name`` in the RUNS stream; None when it has none."""
        raise NotImplementedError

    async def pin_eval(self, team: str, run_id: str, step: int, path: str) -> None:
        """Record the eval of the run's checkpoint ``step`` (which pins it) before its ``checkpoint.saved``."""
        raise NotImplementedError

    async def pinned(self, run_id: str) -> set[int]:
        """Steps of the run's checkpoints an eval run still reads."""
        raise NotImplementedError

    async def submitted_config(
        self, team: str, run_id: str, foreground_too: bool = False
    ) -> tuple[ConfigSubmitted, RunConfig]:
        """The run's config, read back from its ``config.submitted`` event (the event log is the truth).

        Raises:
            LauncherError: the run has no ``config.submitted``, or its config names another team than sent it.
            ForegroundRun: ``runctl run`` carries the run in its own process (unless ``foreground_too``).
            ConfigError: the submitted settings no longer validate.
        """
        data = await self.last_event(team, run_id, ConfigSubmitted.event_name)
        if data is None:
            raise LauncherError(
                f"no config.submitted for run {run_id} of team {team} in its {team_stream(RUNS_STREAM, team)} stream, "
                "so there is nothing to launch. Fix: submit the config again.",
                run_id=run_id,
                team=team,
            )
        submitted = parse_event(data).data
        assert isinstance(submitted, ConfigSubmitted)
        if submitted.via == "foreground" and not foreground_too:
            raise ForegroundRun(f"run {run_id} is carried by `runctl run` in its own process", run_id=run_id)
        values = submitted_values(submitted.run_type, submitted.resolved)  # over this cluster's site.env
        config = validate_settings(submitted.run_type, values, source=run_id)
        if config.team != team:
            # The subject's team is who sent it (the bus lets a team publish on its own subjects only); the config
            # may not claim another team's quota, folders or sandboxes.
            raise LauncherError(
                f"run {run_id} was submitted by team {team} but its config says TEAM={config.team}: it is not "
                f"carried. Fix: submit it with TEAM={team}, or as team {config.team}.",
                run_id=run_id,
                team=team,
            )
        return submitted, config


class Books(RunBooks):
    """The launcher's books: the services' buckets and streams, read and written directly."""

    def __init__(self, bus: Bus, ledger: Ledger, source: str) -> None:
        super().__init__(bus, source)
        self.ledger = ledger
        self._evals: list[EvalStore] = []

    async def entry(self, run_id: str) -> LedgerEntry | None:
        return await self.ledger.get(run_id)

    async def record(self, run_id: str, entry: LedgerEntry) -> None:
        await retrying(lambda: self.ledger.put(run_id, entry), f"record {run_id} in the ledger")

    async def close(self, team: str, run_id: str, outcome: str) -> None:
        await self.record(run_id, LedgerEntry(team=team, state="ended", outcome=outcome))
        await retrying(lambda: self.ledger.release(run_id), f"release what {run_id} held")
        await retrying(lambda: self.ledger.dequeue(run_id), f"take {run_id} off the queue")

    async def published_trials(self, team: str, run_id: str, known: int = 0) -> int:
        subject = event_subject(team, run_id, TrialFinished.event_name)
        ids: set[str] = set()
        seq = 1
        try:
            while True:
                try:
                    msg = await self.bus.js.get_msg(team_stream(TRIALS_STREAM, team), seq, subject=subject, next=True)
                except nats.js.errors.NotFoundError:
                    break
                ids.add(parse_event(msg.data or b"").id)
                seq = int(msg.seq or seq) + 1
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError, ValueError) as e:
            log.warning("could not count the trials of %s on the bus (%s); %d saved", run_id, e, known)
            return known
        return max(known, len(ids))

    async def last_event(self, team: str, run_id: str, name: str) -> bytes | None:
        try:
            msg = await self.bus.js.get_last_msg(team_stream(RUNS_STREAM, team), event_subject(team, run_id, name))
        except nats.js.errors.NotFoundError:
            return None
        return msg.data or b""

    async def _store(self) -> EvalStore:
        if not self._evals:
            self._evals.append(await EvalStore.open(self.bus))
        return self._evals[0]

    async def pin_eval(self, team: str, run_id: str, step: int, path: str) -> None:
        await (await self._store()).create(EvalEntry(run_id, team, step, path, eval_run_id(run_id, step)))

    async def pinned(self, run_id: str) -> set[int]:
        return await (await self._store()).pinned(run_id)


class DeskBooks(RunBooks):
    """A runner's books, kept through the launcher's desk (services/launcher/desk.py): its bus is its run's login."""

    async def entry(self, run_id: str) -> LedgerEntry | None:
        found = (await desk.ask(self.bus, "ledger_get"))["entry"]
        return LedgerEntry(**found) if found else None

    async def record(self, run_id: str, entry: LedgerEntry) -> None:
        await desk.ask(self.bus, "ledger_put", {"progress": entry.progress})

    async def close(self, team: str, run_id: str, outcome: str) -> None:
        await desk.ask(self.bus, "end", {"outcome": outcome})

    async def published_trials(self, team: str, run_id: str, known: int = 0) -> int:
        try:
            return int((await desk.ask(self.bus, "trials", {"known": known}))["count"])
        except BusError as e:
            log.warning("could not count the trials of %s on the bus (%s); %d saved", run_id, e, known)
            return known

    async def last_event(self, team: str, run_id: str, name: str) -> bytes | None:
        data = (await desk.ask(self.bus, "last", {"event": name}))["data"]
        return None if data is None else str(data).encode()

    async def pin_eval(self, team: str, run_id: str, step: int, path: str) -> None:
        await desk.ask(self.bus, "pin", {"step": step, "checkpoint": path})

    async def pinned(self, run_id: str) -> set[int]:
        return {int(step) for step in (await desk.ask(self.bus, "pinned"))["steps"]}


async def failing_checks(config: RunConfig) -> list[str]:
    """The validator's static checks that fail on ``config`` ("id: message" each), run here in a thread: the
    launcher acts on no one's word that a config passed them — a ``config.validated`` on a team's subject may have
    been written by the team (a foreground run publishes its own), and ``runctl run``'s runs are not checked by the
    validator service at all."""
    from services.validator.library import check_config  # the validator's public face

    results = await asyncio.to_thread(check_config, config)
    return [f"{r.id}: {r.message}" for r in results if r.severity == "fatal"]


async def retrying(action: Callable[[], Awaitable[object]], what: str, window_s: float = RETRY_WINDOW_S) -> None:
    """Retry an idempotent bus operation through a short outage (the connection reconnects by itself).

    Raises:
        BusError: still failing after ``window_s`` seconds.
    """
    deadline = time.monotonic() + window_s
    delay = 0.2
    while True:
        try:
            await action()
            return
        except (BusError, nats.errors.Error, nats.js.errors.Error, TimeoutError) as e:
            if time.monotonic() + delay > deadline:
                raise BusError(f"could not {what} for {window_s:.0f}s: {type(e).__name__}: {e}") from e
            log.warning("could not %s (%s); retrying in %.1fs", what, type(e).__name__, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
