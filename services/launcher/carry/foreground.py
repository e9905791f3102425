"""``runctl run CONFIG``: one run carried in the foreground by the same runner the launcher uses.

The run's events (the same envelopes the bus would carry, with the same deterministic ids) are appended to
``<run folder>/events.jsonl`` and handed to an observer (the CLI's progress display); how far the run got is kept
in ``<run folder>/progress.json``, so ``runctl run CONFIG --run-id ID`` resumes a run that was killed: finished
trials are not run again and none is recorded twice.

With a bus (an embedded stack is up, or ``RUNCTL_NATS_URL`` names one), every event is also published there, from
``config.submitted`` (marked ``via: foreground``, so the validator and the launcher leave the run to this process)
to the end, so the tracker, ``runctl runs`` and the dashboard see the run as they see a submitted one; a
``runctl cancel`` of it reaches this process. If the bus stops answering, the run goes on and says so at the end;
``runctl tracker import RUN_FOLDER`` publishes the rest later.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors

from runctl.bus import Bus
from runctl.config import RunConfig
from runctl.errors import BusError
from runctl.events import CancelRequested, Event, new_event
from runctl.events.payloads import Payload
from runctl.home import private_folder, write_atomic
from runctl.natsauth import view_subject
from runctl.subjects import event_subject
from services.launcher.carry.lifecycle import carry_to_end, run_dir_for
from services.launcher.engines import RunContext

log = logging.getLogger(__name__)
EVENTS_FILE = "events.jsonl"
PROGRESS_FILE = "progress.json"
SOURCE = "/runctl/run"
MIRROR_RETRY_S = 10.0
Observer = Callable[[Event], None]


class EventLog:
    """Appends a run's events to ``events.jsonl``; an id already there is not written again (a resumed run)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: set[str] = set()
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    self.seen.add(json.loads(line)["id"])
                except (ValueError, KeyError):
                    continue  # a line cut short by a kill

    def append(self, event: Event) -> bool:
        if event.id in self.seen:
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(event.to_json().decode() + "\n")
        self.seen.add(event.id)
        return True


@dataclass
class BusMirror:
    """Publishes a foreground run's events on the bus; gives up (and says where) when the bus stays down."""

    bus: Bus
    lost_at: str | None = None
    """The first event the bus did not take, once it stopped answering."""
    published: int = 0
    _cancel_sub: Any = field(default=None, repr=False)

    async def publish(self, event: Event) -> None:
        if self.lost_at is not None:
            return
        deadline = asyncio.get_running_loop().time() + MIRROR_RETRY_S
        while True:
            try:
                await self.bus.publish(event)
                self.published += 1
                return
            except BusError as e:
                if asyncio.get_running_loop().time() > deadline:
                    log.warning("the bus stopped answering at %s (%s): the run goes on unrecorded", event.name, e)
                    self.lost_at = event.name
                    return
                await asyncio.sleep(0.5)

    async def watch_cancels(self, team: str, run_id: str, cancelled: asyncio.Event, by: list[str]) -> None:
        """A ``cancel.requested`` of this run (``runctl cancel``) cancels it here."""

        async def on_cancel(msg: Any) -> None:
            from runctl.events import parse_event

            data = parse_event(msg.data).data
            by.append(data.requested_by if isinstance(data, CancelRequested) else "?")
            cancelled.set()

        subject = event_subject(team, run_id, CancelRequested.event_name)
        if self.bus.team is not None:  # in a team's account, its copy of the request (runctl.natsauth)
            subject = view_subject(subject)
        try:
            self._cancel_sub = await self.bus.nc.subscribe(subject, cb=on_cancel)
        except nats.errors.Error as e:  # a user without the right to read it: Ctrl-C still cancels
            log.warning("cannot follow cancels of %s on the bus (%s): Ctrl-C cancels it here", run_id, e)

    async def pinned(self, run_id: str) -> Callable[[], Awaitable[set[int]]]:
        """Which checkpoints of the run the stack's eval runs still read (MAX_CKPT_TO_KEEP spares them)."""
        from services.launcher.evalstore import EvalStore

        try:
            store = await EvalStore.open(self.bus)
        except (nats.errors.Error, nats.js.errors.Error) as e:
            log.warning("cannot read the stack's evals (%s): MAX_CKPT_TO_KEEP spares no checkpoint for them", e)

            async def none() -> set[int]:
                return set()

            return none

        async def pinned() -> set[int]:
            return await store.pinned(run_id)

        return pinned

    async def close(self) -> None:
        if self._cancel_sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._cancel_sub.unsubscribe()


async def run_foreground(
    config: RunConfig,
    run_id: str,
    observer: Observer,
    progress_hook: Callable[[int, int], None] | None = None,
    *,
    opening: list[Payload] | None = None,
    mirror: BusMirror | None = None,
    secret_values: frozenset[str] = frozenset(),
) -> tuple[Event, Path]:
    """Carry the run to its end; return its end event and its folder. SIGINT/SIGTERM cancel it cleanly.

    Args:
        config: the run's config.
        run_id: its id (an existing run's id resumes it).
        observer: told every new event.
        progress_hook: told (trials done, trials in all) when the loop starts.
        opening: events recorded before the runner starts (``config.submitted``, the verdict), with fixed keys.
        mirror: where to publish the events too (a bus), if anywhere.
        secret_values: secrets the config interpolated into other values, for the run's records to redact.
    """
    team = config.team
    run_dir = private_folder(run_dir_for(team, run_id, config))
    log_file = EventLog(run_dir / EVENTS_FILE)
    progress_path = run_dir / PROGRESS_FILE
    progress: dict[str, Any] = json.loads(progress_path.read_text()) if progress_path.exists() else {}

    async def emit(payload: Payload, key: str) -> None:
        event = new_event(payload, team=team, run_id=run_id, source=SOURCE, event_id=f"{run_id}.{key}")
        if log_file.append(event):
            observer(event)
        if mirror is not None:
            await mirror.publish(event)  # again on a resume: the bus and the tracker drop what they have

    async def save(state: dict[str, Any]) -> None:
        write_atomic(progress_path, json.dumps(state))

    for payload in opening or []:
        await emit(payload, _opening_key(payload))
    cancelled = asyncio.Event()
    requested_by: list[str] = []
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, cancelled.set)
    ctx = RunContext(run_id, team, config, run_dir, emit, save, progress, cancelled, secret_values=secret_values)
    if progress_hook is not None:
        ctx.progress_hook = progress_hook
    try:
        if mirror is not None:
            await mirror.watch_cancels(team, run_id, cancelled, requested_by)
            ctx.pinned_checkpoints = await mirror.pinned(run_id)
        end = await carry_to_end(ctx, lambda: requested_by[-1] if requested_by else "signal")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if mirror is not None:
            await mirror.close()
    await save({**ctx.progress, "ended": end.event_name})
    event = new_event(end, team=team, run_id=run_id, source=SOURCE, event_id=f"{run_id}.end")
    if log_file.append(event):
        observer(event)
    if mirror is not None:
        await mirror.publish(event)
    return event, run_dir


def _opening_key(payload: Payload) -> str:
    """The keys a submitted run's opening events have (``<run>.submitted``, ``<run>.verdict``)."""
    return "submitted" if payload.event_name == "config.submitted" else "verdict"
