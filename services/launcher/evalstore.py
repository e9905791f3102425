"""Where the launcher keeps each checkpoint's eval: one entry per (train run, step) in the ``runctl_evals`` KV
bucket, created once (a second create fails, so a checkpoint is evaluated exactly once) and marked as its eval run
moves from queued to submitted to ended. The launcher's eval trigger (``evals.py``) writes it; whoever carries a run
to its end (the launcher, a Ray job's runner, ``runctl run``) marks the run's entry ended.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Literal

import nats.js.errors
from nats.js.kv import KeyValue

from runctl.bus import Bus
from runctl.bus.kv import bucket_keys, open_bucket
from runctl.subjects import kv_bucket

BUCKET = kv_bucket("evals")
EvalState = Literal["queued", "submitted", "ended"]


@dataclass
class EvalEntry:
    parent: str
    team: str
    step: int
    checkpoint: str
    eval_run: str
    state: EvalState = "queued"
    outcome: str = ""


def eval_run_id(parent: str, step: int) -> str:
    return f"{parent}-eval-s{step}"


def eval_pin(bus: Bus, team: str, parent: str) -> Callable[[int, str], Awaitable[None]]:
    """What a runner calls before it publishes a checkpoint: the checkpoint's eval entry, queued (its first create
    wins, so the launcher hearing the event later finds it there). Pinned from then until its eval run ends."""
    stores: list[EvalStore] = []

    async def pin(step: int, path: str) -> None:
        if not stores:
            stores.append(await EvalStore.open(bus))
        await stores[0].create(EvalEntry(parent, team, step, path, eval_run_id(parent, step)))

    return pin


def key_of(parent: str, step: int) -> str:
    return f"{parent}.{step}"


class EvalStore:
    def __init__(self, kv: KeyValue, bus: Bus) -> None:
        self.kv = kv
        self.bus = bus

    @classmethod
    async def open(cls, bus: Bus) -> EvalStore:
        return cls(await open_bucket(bus.js, BUCKET), bus)

    async def create(self, entry: EvalEntry) -> bool:
        """Record a new eval; False when this checkpoint has one already."""
        try:
            await self.kv.create(key_of(entry.parent, entry.step), json.dumps(asdict(entry)).encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True

    async def put(self, entry: EvalEntry) -> None:
        await self.kv.put(key_of(entry.parent, entry.step), json.dumps(asdict(entry)).encode())

    async def entries(self, parent: str | None = None) -> list[EvalEntry]:
        found = []
        for key in await bucket_keys(self.bus.js, BUCKET, parent or ""):
            try:
                got = await self.kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                continue
            if got.value:
                found.append(EvalEntry(**json.loads(got.value)))
        return sorted(found, key=lambda e: (e.parent, e.step))

    async def pinned(self, parent: str) -> set[int]:
        """Steps of ``parent`` whose eval run has not ended."""
        return {e.step for e in await self.entries(parent) if e.state != "ended"}
