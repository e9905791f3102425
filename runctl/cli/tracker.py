"""``runctl tracker``: rebuild the tracker's database from the bus, import a foreground run's events."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from runctl.cli.app import app, escape, new_client, new_console, run_sync

tracker_app = typer.Typer(help="The tracker: the run record in SQL, its API and dashboard.", no_args_is_help=True)

app.add_typer(tracker_app, name="tracker")


@tracker_app.command("rebuild")
def tracker_rebuild(
    db: Annotated[
        str | None,
        typer.Option(help="The empty database to fill (default: RUNCTL_DB_URL, else the home's tracker.db)."),
    ] = None,
) -> None:
    """Replay the event streams into an empty database: the same records the live tracker made."""
    from runctl.bus import Bus
    from services.tracker.library import db_url, make_engine, rebuild

    url = db or db_url()

    async def go() -> Any:
        bus = await Bus.connect(None)
        try:
            return await rebuild(bus, make_engine(url))
        finally:
            await bus.close()

    report = run_sync(go)
    console = new_console()
    read = ", ".join(f"{count} from {stream}" for stream, count in report.streams.items())
    console.print(f"[green]rebuilt[/] {url.split('?')[0]}: {report.stored} events stored ({read})")
    for reason in report.skipped:
        console.print(f"[yellow]skipped[/] {escape(reason)}")


@tracker_app.command("import")
def tracker_import(
    run_dir: Annotated[Path, typer.Argument(help="A run folder that `runctl run` wrote (it holds events.jsonl).")],
) -> None:
    """Publish a foreground run's recorded events (events.jsonl) on the bus, so the tracker records the run. Events
    the bus already has are dropped by their ids: importing twice, or after a partial record, is safe."""
    from runctl.sdk import import_events

    async def go() -> tuple[int, int]:
        async with new_client() as client:
            return await import_events(client, run_dir)

    published, total = run_sync(go)
    new_console().print(f"published {published} of the {total} events in {run_dir / 'events.jsonl'}")
