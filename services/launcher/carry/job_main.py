"""The runner as a Ray job: ``python -m services.launcher.carry.job_main TEAM RUN_ID`` (what the launcher
submits).

It reads the run's config from its ``config.submitted`` event, resumes from the launcher's ledger, carries the
run with its engine in this process (publishing every event, and the end, on the bus), and exits. ``ray job stop``
(SIGTERM) cancels the run; the requester is read from the run's ``cancel.requested`` event.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import nats.js.errors

from runctl.bus import Bus
from runctl.events import CancelRequested, parse_event
from runctl.events.payloads import RUNS_STREAM
from runctl.service import SOURCE_PREFIX, setup_logging
from runctl.subjects import event_subject
from services.launcher.carry.books import Books
from services.launcher.carry.inprocess import carry_in_process
from services.launcher.evalstore import EvalStore
from services.launcher.ledger import Ledger


async def requester(bus: Bus, team: str, run_id: str) -> str:
    """Who asked to cancel the run, from its last ``cancel.requested`` event."""
    try:
        msg = await bus.js.get_last_msg(RUNS_STREAM, event_subject(team, run_id, CancelRequested.event_name))
    except nats.js.errors.NotFoundError:
        return "ray job stop"
    data = parse_event(msg.data or b"").data
    return data.requested_by if isinstance(data, CancelRequested) else "ray job stop"


async def main(team: str, run_id: str) -> int:
    setup_logging("runner")
    bus = await Bus.connect(None, name=f"runctl-runner-{run_id}", reconnect=True, as_team=False)
    try:
        ledger = await Ledger.open(bus)
        entry = await ledger.get(run_id)
        if entry is not None and entry.state == "ended":
            return 0
        books = Books(bus, ledger, SOURCE_PREFIX + "runner")
        _, config = await books.submitted_config(team, run_id)
        cancelled, by = asyncio.Event(), ["ray job stop"]

        async def cancel() -> None:
            by[0] = await requester(bus, team, run_id)
            cancelled.set()

        pending: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: pending.add(loop.create_task(cancel())))
        progress = entry.progress if entry else {}
        store = await EvalStore.open(bus)

        async def pinned() -> set[int]:
            return await store.pinned(run_id)

        await carry_in_process(books, team, run_id, config, progress, cancelled, lambda: by[0], pinned=pinned)
        return 0
    finally:
        await bus.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
