"""The runner as a Ray job: ``python -m services.launcher.carry.job_main TEAM RUN_ID`` (what the launcher
submits).

It logs in with its run's own login (``RUNCTL_NATS_URL``, made by the launcher: ``runctl.runlogins``), reads the
run's config from its ``config.submitted`` event and its progress from the launcher's ledger (both through the
launcher's desk), carries the run with its engine in this process (publishing every event, and the end, on the
bus), and exits. ``ray job stop``
(SIGTERM) cancels the run; the requester is read from the run's ``cancel.requested`` event.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from runctl.bus import Bus
from runctl.events import CancelRequested, parse_event
from runctl.service import SOURCE_PREFIX, setup_logging
from services.launcher.carry.books import Books, DeskBooks, RunBooks
from services.launcher.carry.inprocess import carry_in_process
from services.launcher.ledger import Ledger


async def requester(books: RunBooks, team: str, run_id: str) -> str:
    """Who asked to cancel the run, from its last ``cancel.requested`` event."""
    data = await books.last_event(team, run_id, CancelRequested.event_name)
    found = parse_event(data).data if data is not None else None
    return found.requested_by if isinstance(found, CancelRequested) else "ray job stop"


async def main(team: str, run_id: str) -> int:
    setup_logging("runner")
    bus = await Bus.connect(None, name=f"runctl-runner-{run_id}", reconnect=True, as_team=False)
    try:
        books: RunBooks
        if bus.run is not None:  # the run's own login: what it keeps outside its events, it asks the desk for
            books = DeskBooks(bus, SOURCE_PREFIX + "runner")
        else:  # a bus runctl does not configure (RUNCTL_RUN_LOGINS=off): the launcher's login
            books = Books(bus, await Ledger.open(bus), SOURCE_PREFIX + "runner")
        entry = await books.entry(run_id)
        if entry is not None and entry.state == "ended":
            return 0
        _, config = await books.submitted_config(team, run_id)
        cancelled, by = asyncio.Event(), ["ray job stop"]

        async def cancel() -> None:
            by[0] = await requester(books, team, run_id)
            cancelled.set()

        pending: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: pending.add(loop.create_task(cancel())))
        progress = entry.progress if entry else {}

        async def pinned() -> set[int]:
            return await books.pinned(run_id)

        await carry_in_process(books, team, run_id, config, progress, cancelled, lambda: by[0], pinned=pinned)
        return 0
    finally:
        await bus.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
