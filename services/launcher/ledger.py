"""The launcher's ledger of runs in JetStream KV: which runs it admitted, how far each got, which ended.

It is what lets a launcher killed mid-run resume every unfinished run on restart, and what makes its handlers
idempotent (a redelivered ``config.validated`` finds the run already there).
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
            entry = await self.get(key)
            if entry is not None and entry.state == "active":
                found[key] = entry
        return found
