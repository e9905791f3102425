"""Carrying a run in this process: the engine runs here, its events and progress go to the run's books, and the
run gets exactly one end event. The launcher does this for ``ENGINE=fake`` runs (and for every run when it submits
no Ray jobs); the runner job does it for the run it was started for."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from runctl.config.models import RunConfig, TrainConfig
from runctl.errors import BusError
from runctl.events.payloads import Payload
from services.launcher.carry.books import RunBooks
from services.launcher.carry.lifecycle import carry_to_end, run_dir_for
from services.launcher.engines import RunContext
from services.launcher.ledger import LedgerEntry

log = logging.getLogger(__name__)


async def carry_in_process(
    books: RunBooks,
    team: str,
    run_id: str,
    config: RunConfig,
    progress: dict[str, Any],
    cancelled: asyncio.Event,
    cancelled_by: Callable[[], str],
    on_fatal: Callable[[], None] = lambda: None,
    pinned: Callable[[], Awaitable[set[int]]] | None = None,
) -> None:
    """Run the engine to the end and publish exactly one end event. When the bus or the ledger stays unreachable
    the run is not over, only this process's part in it: ``on_fatal`` is called and the run stays active for the
    next launcher to resume. ``pinned`` tells a train run which of its checkpoints an eval run still reads."""
    run_dir = run_dir_for(team, run_id, config)

    async def emit(payload: Payload, key: str) -> None:
        await books.publish(payload, team, run_id, key)

    async def save(state: dict[str, Any]) -> None:
        await books.record(run_id, LedgerEntry(team=team, state="active", progress=state))

    ctx = RunContext(run_id, team, config, run_dir, emit, save, dict(progress), cancelled, bus=books.bus)
    if pinned is not None:
        ctx.pinned_checkpoints = pinned
    if isinstance(config, TrainConfig) and config.eval_on_checkpoint:

        async def pin(step: int, path: str) -> None:
            await books.pin_eval(team, run_id, step, path)

        ctx.pin_checkpoint = pin
    attempts = max(1, int(progress.get("job_attempt", 1)))
    try:
        end = await carry_to_end(ctx, cancelled_by, reraise=(BusError,), attempts=attempts)
        await books.end(team, run_id, end)
    except BusError as e:
        log.error("%s: %s; stopping so that a restarted launcher resumes the run", run_id, e)
        on_fatal()
