"""The sandbox ledger in JetStream KV: every sandbox a service instance holds, the instances' heartbeats, and the
runs that ended. It is what lets a reaper on any instance tell an orphan from a sandbox in use.

Keys: ``sb.<sandbox_id>`` (an entry), ``owner.<instance>`` (last heartbeat, epoch seconds), ``run.<run_id>``
(the run ended), ``seat.<team>.<seat>`` (one of a team's sandboxes, taken before it is made: what the cap counts).

A team's seats are written once and never changed, so their revisions are the order they were taken in across every
instance: a seat within the first ``cap`` of its team's is granted, any later one is given back. Two instances
creating at once can therefore never both pass the cap, as counting sandboxes first and recording them after could.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from dataclasses import asdict, dataclass

import nats.js.errors
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from runctl.bus import Bus
from runctl.bus.kv import bucket_keys, open_bucket
from runctl.subjects import kv_bucket
from services.sandbox.backends.base import SandboxError

BUCKET = kv_bucket("sandboxes")


@dataclass(frozen=True)
class LedgerEntry:
    sandbox_id: str
    backend: str
    handle: str
    owner: str
    team: str = ""
    run_id: str = ""
    trial: str = ""
    created: float = 0.0
    seat: str = ""
    """The team seat it holds (given back when the entry goes)."""


SANDBOX_ID = re.compile(r"[A-Za-z0-9_=/-]+(\.[A-Za-z0-9_=/-]+)*")


def check_sandbox_id(sandbox_id: str) -> str:
    """``sandbox_id`` when it names one key of the ledger: letters, digits, ``-_=/`` and single dots inside, never a
    wildcard (``*``, ``>``) or an empty part, which would name other sandboxes' entries.

    Raises:
        ValueError: it does not.
    """
    if not SANDBOX_ID.fullmatch(sandbox_id):
        raise ValueError(
            f"sandbox id {sandbox_id[:80]!r} is not one ledger key: letters, digits, '-', '_', '=', '/' and single "
            "dots between them"
        )
    return sandbox_id


class SandboxLedger:
    def __init__(self, kv: KeyValue, js: JetStreamContext) -> None:
        self.kv = kv
        self.js = js

    @classmethod
    async def open(cls, bus: Bus) -> SandboxLedger:
        return cls(await open_bucket(bus.js, BUCKET), bus.js)

    async def _keys(self, prefix: str) -> list[str]:
        return await bucket_keys(self.js, BUCKET, prefix)

    async def _get(self, key: str) -> bytes | None:
        try:
            entry = await self.kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        return entry.value or None

    async def put(self, entry: LedgerEntry) -> None:
        await self.kv.put(f"sb.{entry.sandbox_id}", json.dumps(asdict(entry)).encode())

    async def entry(self, sandbox_id: str) -> LedgerEntry | None:
        """The ledger's entry of ``sandbox_id`` (one read, however many the ledger holds), or None.

        Raises:
            ValueError: ``sandbox_id`` is not one key of the ledger (see :func:`check_sandbox_id`).
        """
        value = await self._get(f"sb.{check_sandbox_id(sandbox_id)}")
        return LedgerEntry(**json.loads(value)) if value is not None else None

    async def remove(self, sandbox_id: str) -> None:
        """Forget a sandbox, and give back the seat it held."""
        entry = await self.entry(sandbox_id)
        if entry is not None and entry.seat:
            await self.release_seat(entry.team, entry.seat)
        await self.kv.purge(f"sb.{sandbox_id}")

    async def take_seat(self, team: str, seat: str, owner: str) -> int:
        """Record a seat of ``team``; returns its revision (its place among all seats ever taken)."""
        return int(await self.kv.put(f"seat.{team}.{seat}", json.dumps({"owner": owner}).encode()))

    async def release_seat(self, team: str, seat: str) -> None:
        await self.kv.purge(f"seat.{team}.{seat}")

    async def seats(self, team: str = "") -> list[tuple[int, str, str, str]]:
        """(revision, team, seat, owner) of the seats taken (of ``team``, when given), oldest first."""
        found = []
        for key in await self._keys(f"seat.{team}" if team else "seat"):
            try:
                entry = await self.kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                continue
            if entry.value:
                _, seat_team, seat = key.split(".", 2)
                found.append((int(entry.revision or 0), seat_team, seat, json.loads(entry.value)["owner"]))
        return sorted(found)

    async def entries(self) -> dict[str, LedgerEntry]:
        found: dict[str, LedgerEntry] = {}
        for key in await self._keys("sb"):
            value = await self._get(key)
            if value is not None:
                entry = LedgerEntry(**json.loads(value))
                found[entry.sandbox_id] = entry
        return found

    async def heartbeat(self, instance: str) -> None:
        await self.kv.put(f"owner.{instance}", str(time.time()).encode())

    async def forget_owner(self, instance: str) -> None:
        await self.kv.purge(f"owner.{instance}")

    async def live_owners(self, stale_s: float) -> set[str]:
        """Instances whose last heartbeat is newer than ``stale_s`` seconds."""
        now, alive = time.time(), set()
        for key in await self._keys("owner"):
            value = await self._get(key)
            if value is not None and now - float(value) < stale_s:
                alive.add(key.removeprefix("owner."))
        return alive

    async def mark_run_ended(self, team: str, run_id: str) -> None:
        """Record that ``team``'s run ``run_id`` ended (the team is part of the key: another team's end event that
        names the same run id ends nothing of this one)."""
        await self.kv.put(f"run.{team}.{run_id}", str(time.time()).encode())

    async def ended_runs(self) -> set[tuple[str, str]]:
        """(team, run id) of every run recorded as ended."""
        keys = (key.split(".") for key in await self._keys("run"))
        return {(parts[1], parts[2]) for parts in keys if len(parts) == 3}


async def take_seat_within(
    ledger: SandboxLedger, team: str, owner: str, cap: int, wait_s: float, freed: asyncio.Event | None = None
) -> str:
    """One of ``team``'s seats (its cap's worth, counted across every owner), waiting for one up to ``wait_s``
    (woken early by ``freed`` when this process gives one back; others' are seen at the next try, each second).

    Raises:
        SandboxError: none came free in time (the message names the cap).
    """
    deadline = time.monotonic() + wait_s
    while True:
        seat = secrets.token_hex(8)
        mine = await ledger.take_seat(team, seat, owner)
        ahead = sum(1 for revision, *_ in await ledger.seats(team) if revision < mine)
        if ahead < cap:
            return seat
        await ledger.release_seat(team, seat)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SandboxError(
                f"team {team} holds {ahead} sandboxes, its cap is {cap}: wait for some to end "
                "(pass wait_s), or raise the cap (RUNCTL_SANDBOX_CAPS)."
            )
        if freed is None:
            await asyncio.sleep(min(remaining, 1.0))
            continue
        freed.clear()
        try:
            await asyncio.wait_for(freed.wait(), min(remaining, 1.0))
        except TimeoutError:
            pass  # other owners free seats too: try again
