"""The launcher's ledger of runs in JetStream KV: which runs it admitted, how far each got, which ended.

It is what lets a launcher killed mid-run resume every unfinished run on restart, and what makes its handlers
idempotent (a redelivered ``config.validated`` finds the run already there).

Keys: ``<run_id>`` (a run admitted: its state and progress), ``queue.<run_id>`` (a validated run waiting for
admission: its team, demand, priority and place in submission order), ``grant.<run_id>`` (what an admitted run holds
until it ends: the usage admission counts). A grant is created, never overwritten: of two launchers admitting the same
run, one creates it and the other finds it there, so a run is admitted once.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from runctl.bus import Bus
from runctl.bus.kv import bucket_keys, open_bucket
from runctl.subjects import kv_bucket

BUCKET = kv_bucket("launcher")
LedgerState = Literal["active", "ended"]


@dataclass
class LedgerEntry:
    team: str
    state: LedgerState
    progress: dict[str, Any] = field(default_factory=dict)
    outcome: str = ""


@dataclass
class Queued:
    team: str
    demand: dict[str, float]
    priority: int
    seq: float
    """Submission order: when the run was validated (epoch seconds)."""
    announced: bool = False
    """Its ``run.queued`` is published."""


@dataclass
class Grant:
    team: str
    granted: dict[str, float]
    at: float


class Ledger:
    def __init__(self, kv: KeyValue, js: JetStreamContext) -> None:
        self.kv = kv
        self.js = js

    @classmethod
    async def open(cls, bus: Bus) -> Ledger:
        return cls(await open_bucket(bus.js, BUCKET), bus.js)

    async def get(self, run_id: str) -> LedgerEntry | None:
        try:
            entry = await self.kv.get(run_id)
        except nats.js.errors.KeyNotFoundError:
            return None
        if entry.value is None:
            return None
        return LedgerEntry(**json.loads(entry.value))

    async def put(self, run_id: str, entry: LedgerEntry) -> None:
        await self.kv.put(run_id, json.dumps(asdict(entry)).encode())

    async def active(self) -> dict[str, LedgerEntry]:
        """Every run admitted and not yet ended."""
        found: dict[str, LedgerEntry] = {}
        for key in await bucket_keys(self.js, BUCKET):
            if "." in key:
                continue  # a queue entry or a grant (run ids have no dots)
            entry = await self.get(key)
            if entry is not None and entry.state == "active":
                found[key] = entry
        return found

    async def _json(self, key: str) -> dict[str, Any] | None:
        try:
            entry = await self.kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        return json.loads(entry.value) if entry.value else None

    async def _create(self, key: str, record: Queued | Grant) -> bool:
        """Write ``key`` once: False when it is there already."""
        try:
            await self.kv.create(key, json.dumps(asdict(record)).encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True

    async def _under(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Run id → value of each key under ``prefix.``."""
        found: dict[str, dict[str, Any]] = {}
        for key in await bucket_keys(self.js, BUCKET, prefix):
            value = await self._json(key)
            if value is not None:
                found[key.removeprefix(f"{prefix}.")] = value
        return found

    async def enqueue(self, run_id: str, queued: Queued) -> bool:
        """Put a run in the queue; False when it is there already (a redelivered ``config.validated``)."""
        return await self._create(f"queue.{run_id}", queued)

    async def queued(self) -> dict[str, Queued]:
        return {run_id: Queued(**value) for run_id, value in (await self._under("queue")).items()}

    async def announce(self, run_id: str, queued: Queued) -> None:
        queued.announced = True
        await self.kv.put(f"queue.{run_id}", json.dumps(asdict(queued)).encode())

    async def dequeue(self, run_id: str) -> None:
        await self.kv.purge(f"queue.{run_id}")

    async def grant(self, run_id: str, grant: Grant) -> bool:
        """Record what an admitted run holds; False when another launcher admitted it first."""
        return await self._create(f"grant.{run_id}", grant)

    async def grants(self) -> dict[str, Grant]:
        return {run_id: Grant(**value) for run_id, value in (await self._under("grant")).items()}

    async def release(self, run_id: str) -> None:
        """The run ended: what it held is free again."""
        await self.kv.purge(f"grant.{run_id}")
