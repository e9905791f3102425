"""A run's sandboxes, made by its runner on the backend it opened, booked in the sandbox service's ledger as the
service's own are: so a team's cap holds across all its runs and the service's sandboxes, every sandbox carries its
owner, and the service's reaper destroys the sandboxes of a runner that died.

The runner is an owner like a service instance: it heart-beats ``owner.<runner>`` in the ledger; each sandbox takes
one of its team's seats before it is made (the ledger orders seats, so concurrent creates cannot pass the cap), is
recorded before it exists and forgotten after it is gone, and carries the owner and scope labels the reaper reads.
A runner SIGKILLed stops heart-beating: after ``STALE_S`` the reaper (every ``REAP_EVERY_S``) destroys its
sandboxes and gives back their seats. Each sandbox is announced as ``sandbox.created`` / ``sandbox.destroyed``
events of the run (its sandbox-minutes in the usage ledger).

A runner on its run's own bus login (``runctl.runlogins``) reaches no bucket: its bookings go through the launcher's
desk (:class:`DeskLedger`), which books that run's sandboxes only, under the team's cap as the launcher's settings
give it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, replace
from typing import Any

from runctl.bus import Bus, desk
from runctl.events import SandboxCreated, SandboxDestroyed
from runctl.events.payloads import Payload
from services.sandbox.backends.base import OWNER_LABEL, Backend, OwnedSandbox, Sandbox, SandboxError, SandboxSpec
from services.sandbox.ledger import LedgerEntry, SandboxLedger, take_seat_within
from services.sandbox.owners import HEARTBEAT_S, SCOPE_LABEL, instance_name
from services.sandbox.settings import SandboxSettings

log = logging.getLogger(__name__)

SEAT_WAIT_S = 600.0
"""How long a trial waits for one of its team's seats before its sandbox fails to set up."""


def runner_owner(team: str = "", run_id: str = "") -> str:
    """An owner name as a service instance's, marked as a runner's (and, asked through the launcher's desk, as one of
    that run's: ``runner-<team>.<run>.<instance>``, the only names the desk lets the run use)."""
    return f"runner-{team}.{run_id}.{instance_name()}" if team else f"runner-{instance_name()}"


class DeskLedger:
    """The sandbox ledger as a runner on its run's own bus login reaches it: through the launcher's desk, which
    books only that run's sandboxes, under its team's cap (``services/launcher/desk.py``)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def heartbeat(self, owner: str) -> None:
        await desk.ask(self.bus, "beat", {"owner": owner})

    async def forget_owner(self, owner: str) -> None:
        await desk.ask(self.bus, "forget", {"owner": owner})

    async def put(self, entry: LedgerEntry) -> None:
        await desk.ask(self.bus, "book", {"entry": asdict(entry)})

    async def remove(self, sandbox_id: str) -> None:
        await desk.ask(self.bus, "unbook", {"sandbox_id": sandbox_id})

    async def seat_within(self, team: str, owner: str, wait_s: float) -> str:
        """One of the team's seats, asked for each second until ``wait_s`` passes.

        Raises:
            SandboxError: none came free in time.
        """
        deadline = time.monotonic() + wait_s
        while True:
            answer = await desk.ask(self.bus, "seat", {"owner": owner})
            if answer.get("seat"):
                return str(answer["seat"])
            if time.monotonic() > deadline:
                raise SandboxError(str(answer.get("full") or f"team {team} has no free sandbox seat"))
            await asyncio.sleep(1.0)


class BookedBackend:
    """``inner`` with every create and destroy booked in the ledger. Called from the trial threads; the ledger's
    writes run on the runner's event loop and are awaited."""

    def __init__(
        self,
        inner: Backend,
        ledger: SandboxLedger | DeskLedger,
        loop: asyncio.AbstractEventLoop,
        owner: str,
        team: str,
        run_id: str,
        cap: int,
        scope: str,
        emit: Callable[[Payload, str], Awaitable[None]],
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.ledger = ledger
        self.loop = loop
        self.owner = owner
        self.team = team
        self.run_id = run_id
        self.cap = cap
        self.scope = scope
        self.emit = emit

    def _await(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def create(self, spec: SandboxSpec) -> Sandbox:
        return self._await(self._create(spec))  # type: ignore[no-any-return]

    def destroy(self, sandbox: Sandbox) -> None:
        try:
            self.inner.destroy(sandbox)
        finally:
            self._await(self._forget(sandbox.sandbox_id, sandbox.spec.labels.get("runctl.trial", "")))

    def destroy_owned(self, owned: OwnedSandbox) -> None:
        try:
            self.inner.destroy_owned(owned)
        finally:
            self._await(self._forget(owned.sandbox_id, owned.labels.get("runctl.trial", ""), announce=False))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _create(self, spec: SandboxSpec) -> Sandbox:
        if isinstance(self.ledger, DeskLedger):
            seat = await self.ledger.seat_within(self.team, self.owner, SEAT_WAIT_S)
        else:
            seat = await take_seat_within(self.ledger, self.team, self.owner, self.cap, SEAT_WAIT_S)
        spec = replace(spec, labels={**spec.labels, OWNER_LABEL: self.owner, SCOPE_LABEL: self.scope})
        trial = spec.labels.get("runctl.trial", "")
        entry = LedgerEntry(
            spec.sandbox_id, self.inner.name, "", self.owner, self.team, self.run_id, trial, time.time(), seat
        )
        started = time.monotonic()
        await self.ledger.put(entry)  # first in the ledger, so a crash during the create leaves a trace
        try:
            sandbox = await asyncio.to_thread(self.inner.create, spec)
        except BaseException:
            await self.ledger.remove(spec.sandbox_id)
            raise
        await self.ledger.put(replace(entry, handle=sandbox.handle))
        created = SandboxCreated(
            sandbox_id=sandbox.sandbox_id,
            backend=self.inner.name,
            trial=trial,
            image=spec.image or "",
            owner=self.owner,
            seconds=time.monotonic() - started,
        )
        await self._announce(created, f"sandbox.{sandbox.sandbox_id}.created")
        return sandbox

    async def _forget(self, sandbox_id: str, trial: str, announce: bool = True) -> None:
        await self.ledger.remove(sandbox_id)
        if announce:
            destroyed = SandboxDestroyed.model_validate(
                {"sandbox_id": sandbox_id, "backend": self.inner.name, "trial": trial, "reason": "released"}
            )
            await self._announce(destroyed, f"sandbox.{sandbox_id}.destroyed")

    async def _announce(self, payload: Payload, key: str) -> None:
        try:
            await self.emit(payload, key)
        except Exception as e:  # a lost event is a gap in the run's usage, not a reason to fail its trial
            log.warning("could not publish %s: %s", payload.event_name, e)


@contextlib.asynccontextmanager
async def booked(
    inner: Backend, bus: Bus, team: str, run_id: str, emit: Callable[[Payload, str], Awaitable[None]]
) -> AsyncIterator[BookedBackend]:
    """``inner`` booked in the ledger for the run, the runner heart-beating as its owner until the block ends."""
    ledger: SandboxLedger | DeskLedger
    if bus.run is not None:  # a run's own login: the launcher's desk books for it
        ledger, owner = DeskLedger(bus), runner_owner(team, run_id)
    else:
        ledger, owner = await SandboxLedger.open(bus), runner_owner()
    await ledger.heartbeat(owner)
    loop = asyncio.get_running_loop()

    async def beat() -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await ledger.heartbeat(owner)
            except Exception as e:  # a missed beat is retried; ten seconds of them and the reaper takes over
                log.warning("sandbox ledger heartbeat: %s", e)

    beating = asyncio.create_task(beat())
    try:
        settings = SandboxSettings.from_env()  # the service's settings: the same cap and scope as its own sandboxes
        yield BookedBackend(inner, ledger, loop, owner, team, run_id, settings.cap_of(team), settings.scope, emit)
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
        with contextlib.suppress(Exception):
            await ledger.forget_owner(owner)
