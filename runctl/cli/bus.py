"""``runctl bus``: the operator's work on the bus itself."""

from __future__ import annotations

from typing import Any

import typer

from runctl.cli.app import app, new_console, run_sync

bus_app = typer.Typer(help="The bus: NATS with JetStream, as the services keep it.", no_args_is_help=True)

app.add_typer(bus_app, name="bus")


@bus_app.command("migrate")
def bus_migrate() -> None:
    """Move the events and consumers of an earlier runctl's shared RUNS and TRIALS streams into per-team streams.
    Run it once with the services stopped, on the services' or the admin's login (RUNCTL_NATS_URL); it resumes if
    cut short. `runctl up` does it for its own bus."""
    from runctl.bus import Bus
    from runctl.bus.migrate import migrate_shared_streams

    async def go() -> Any:
        bus = await Bus.connect(None, as_team=False)
        try:
            return await migrate_shared_streams(bus)
        finally:
            await bus.close()

    done = run_sync(go)
    console = new_console()
    if not done:
        console.print("nothing to move: this bus keeps every team's events in streams of its own already")
        return
    for family, count in done.copied.items():
        console.print(f"[green]moved[/] {count} events of the shared {family} stream into per-team streams")
    for stream, durables in sorted(done.consumers.items()):
        console.print(f"  {stream}: consumers {', '.join(durables)} carried over from where they were")
