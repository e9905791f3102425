"""The launcher's desk: what a runner may ask of the services about its own run, and nothing else.

A runner logs in to the bus with its run's login (``runctl.runlogins``), which may publish its run's events and
requests on ``_runctl.desk.<team>.<run>.<op>`` only: no key-value bucket, no JetStream API. What it used to read and
write in the services' buckets itself it asks here, and the desk answers about that (team, run) alone — the
subject is the run's identity, since the bus lets a run's login publish on no other run's desk:

- ``ledger_get`` / ``ledger_put`` / ``end``: its entry in the launcher's ledger (progress; at its end, the entry
  ended and what it held given back);
- ``last``: the last ``config.submitted`` or ``cancel.requested`` of the run; ``trials``: how many of its trials
  are on the bus;
- ``pin`` / ``pinned``: a checkpoint's eval recorded before ``checkpoint.saved`` goes out, and which of its
  checkpoints an eval still reads;
- ``beat`` / ``forget`` / ``seat`` / ``book`` / ``unbook``: its sandboxes in the sandbox ledger (an owner named for
  the run, a seat within the team's cap as the launcher's settings give it, entries of that run only).

A request about a run the launcher does not carry for that team is refused the same way whether the run is
another team's or does not exist. Every reply is JSON ``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import asdict
from typing import Any

import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from runctl.bus import Bus
from runctl.events import CancelRequested, ConfigSubmitted
from runctl.events.payloads import RUNS_STREAM
from runctl.subjects import desk_filter, event_subject, team_stream
from services.launcher.carry.books import Books
from services.launcher.evalstore import EvalEntry, EvalStore, eval_run_id
from services.launcher.ledger import LedgerEntry
from services.sandbox.library import SandboxError, SandboxLedger, SandboxSettings, sandbox_entry, take_seat_within

log = logging.getLogger(__name__)

#: The events a runner may read back through the desk.
READABLE = (ConfigSubmitted.event_name, CancelRequested.event_name)
MUTATING = ("ledger_put", "pin", "beat", "seat", "book")


class Refused(Exception):
    """A request the desk does not grant (its message goes back to the runner)."""


def desk_owner_prefix(team: str, run_id: str) -> str:
    """Every sandbox owner a run's runner may name begins so (``runner-<team>.<run>.``)."""
    return f"runner-{team}.{run_id}."


class Desk:
    def __init__(self, bus: Bus, books: Books, evals: EvalStore, sandboxes: SandboxLedger) -> None:
        self.bus = bus
        self.books = books
        self.evals = evals
        self.sandboxes = sandboxes
        self.caps = SandboxSettings.from_env()  # the sandbox service's caps, which the launcher is given too
        self.refused = 0
        """Requests refused (a runner asking about another run, or for what its run may not have)."""
        self._sub: Subscription | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(cls, bus: Bus, books: Books) -> Desk:
        return cls(bus, books, await EvalStore.open(bus), await SandboxLedger.open(bus))

    async def start(self) -> None:
        self._sub = await self.bus.nc.subscribe(desk_filter(), queue="launcher-desk", cb=self._on)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _on(self, msg: Msg) -> None:
        task = asyncio.create_task(self._answer(msg))  # a slow answer (a seat, a count) holds up no other
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, msg: Msg) -> None:
        _, _, team, run_id, op = msg.subject.split(".")
        try:
            body = json.loads(msg.data or b"{}")
            if not isinstance(body, dict):
                raise Refused("a request body is a JSON object")
            reply = {"ok": True, **await self.answer(team, run_id, op, body)}
        except Refused as e:
            self.refused += 1
            log.warning("desk: refused %s of run %s of team %s: %s", op, run_id, team, e)
            reply = {"ok": False, "error": str(e)}
        except (ValueError, TypeError, KeyError) as e:
            self.refused += 1
            reply = {"ok": False, "error": f"a malformed {op} request: {type(e).__name__}: {e}"}
        except Exception as e:  # the bus or a bucket failing: the runner retries
            log.warning("desk: %s of run %s failed: %s: %s", op, run_id, type(e).__name__, e)
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}", "retry": True}
        with contextlib.suppress(Exception):  # the runner gave up waiting
            await msg.respond(json.dumps(reply).encode())

    async def answer(self, team: str, run_id: str, op: str, body: dict[str, Any]) -> dict[str, Any]:
        entry = await self.books.ledger.get(run_id)
        if entry is None or entry.team != team:
            raise Refused(f"the launcher carries no run {run_id} of team {team}")
        if op in MUTATING and entry.state != "active":
            raise Refused(f"run {run_id} has ended: {op} is not done for it")
        handler = getattr(self, f"_{op}", None)
        if handler is None:
            raise Refused(f"no desk operation {op!r}")
        result: dict[str, Any] = await handler(team, run_id, entry, body)
        return result

    async def _ledger_get(self, team: str, run_id: str, entry: LedgerEntry, body: dict[str, Any]) -> dict[str, Any]:
        return {"entry": asdict(entry)}

    async def _ledger_put(self, team: str, run_id: str, entry: LedgerEntry, body: dict[str, Any]) -> dict[str, Any]:
        progress = body["progress"]
        if not isinstance(progress, dict):
            raise Refused("progress is a JSON object")
        await self.books.ledger.put(run_id, LedgerEntry(team=team, state="active", progress=progress))
        return {}

    async def _end(self, team: str, run_id: str, entry: LedgerEntry, body: dict[str, Any]) -> dict[str, Any]:
        """What the runner's end event leaves to the ledger (the event itself the runner publishes first)."""
        outcome = str(body["outcome"])
        if not outcome.startswith("run."):
            raise Refused(f"{outcome!r} is not a run's end")
        if entry.state == "ended":
            return {}  # the launcher ended it first (a cancel): the first end stands
        await self.books.ledger.put(run_id, LedgerEntry(team=team, state="ended", outcome=outcome))
        await self.books.ledger.release(run_id)
        await self.books.ledger.dequeue(run_id)
        return {}

    async def _last(self, team: str, run_id: str, entry: LedgerEntry, body: dict[str, Any]) -> dict[str, Any]:
        event = str(body["event"])
        if event not in READABLE:
            raise Refused(f"a runner reads back only {', '.join(READABLE)}, not {event}")
        try:
            msg = await self.bus.js.get_last_msg(team_stream(RUNS_STREAM, team), event_subject(team, run_id, event))
        except nats.js.errors.NotFoundError:
            return {"data": None}
        return {"data": (msg.data or b"").decode()}

    async def _trials(self, team: str, run_id: str, entry: LedgerEntry, body: dict[str, Any]) -> dict[str, Any]:
        return {"count": await self.books.published_trials(team, run_id, int(body.get("known", 0)))}

    async def _pin(self, team: str, run_id: str, entry: LedgerEntry, body: dict[str, Any]) -> dict[str, Any]:
        step, checkpoint = int(body["step"]), str(body["checkpoint"])
        created = await self.evals.create(EvalEntry(run_id, team, step, checkpoint, eval_run_id(run_id, step)))
        return {"created": created}

    async def _pinned(self, team: str, run_id: str, entry: LedgerEntry, body: dict[str, Any]) -> dict[str, Any]:
        return {"steps": sorted(await self.evals.pinned(run_id))}

    def _owner(self, team: str, run_id: str, body: dict[str, Any]) -> str:
        owner = str(body["owner"])
        if not owner.startswith(desk_owner_prefix(team, run_id)):
            raise Refused(f"sandbox owner {owner!r} is not one of run {run_id}'s")
        return owner

    async def _beat(self, team: str, run_id: str, entry: LedgerEntry, body: dict[str, Any]) -> dict[str, Any]:
        await self.sandboxes.heartbeat(self._owner(team, run_id, body))
        return {}

    async def _forget(self, team: str, run_id: str, entry: LedgerEntry, body: dict[str, Any]) -> dict[str, Any]:
        await self.sandboxes.forget_owner(self._owner(team, run_id, body))
        return {}

    async def _seat(self, team: str, run_id: str, entry: LedgerEntry, body: dict[str, Any]) -> dict[str, Any]:
        """One try for a seat within the team's cap (the runner tries again until its own deadline)."""
        owner, cap = self._owner(team, run_id, body), self.caps.cap_of(team)
        try:
            return {"seat": await take_seat_within(self.sandboxes, team, owner, cap, 0)}
        except SandboxError as e:  # the cap is full now
            return {"seat": None, "full": str(e)}

    async def _book(self, team: str, run_id: str, entry: LedgerEntry, body: dict[str, Any]) -> dict[str, Any]:
        booked = sandbox_entry({**body["entry"], "team": team, "run_id": run_id})
        self._owner(team, run_id, {"owner": booked.owner})
        await self._own_or_new(team, run_id, booked.sandbox_id)
        await self.sandboxes.put(booked)
        return {}

    async def _unbook(self, team: str, run_id: str, entry: LedgerEntry, body: dict[str, Any]) -> dict[str, Any]:
        sandbox_id = str(body["sandbox_id"])
        if await self._own_or_new(team, run_id, sandbox_id):
            await self.sandboxes.remove(sandbox_id)
        return {}

    async def _own_or_new(self, team: str, run_id: str, sandbox_id: str) -> bool:
        """True when the ledger holds ``sandbox_id`` for this run, False when it holds no such sandbox.

        Raises:
            Refused: the ledger holds it for another run.
        """
        held = await self.sandboxes.entry(sandbox_id)  # ValueError (refused) for an id that is not one key
        if held is not None and (held.team, held.run_id) != (team, run_id):
            raise Refused(f"sandbox {sandbox_id} is not one of run {run_id}'s")
        return held is not None
