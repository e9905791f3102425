"""The commands of a run's life: write a config (``init``), check it (``validate``), submit it or run it here, watch
it, list and show runs, what each team used, cancel one.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from runctl.cli.app import (
    ConfigArg,
    RunArg,
    app,
    checks,
    escape,
    load,
    new_client,
    new_console,
    print_checks,
    refuse_fatal,
    run_sync,
)

if TYPE_CHECKING:
    from runctl.config.loader import ResolvedConfig
    from runctl.sdk import RunctlClient


@app.command()
def init(
    run_type: Annotated[str, typer.Argument(help="train, eval or infer.")],
    name: Annotated[str, typer.Argument(help="Experiment name; the file is NAME.env.")],
    directory: Annotated[Path, typer.Option("--dir", help="Where to write it.")] = Path("."),
    force: Annotated[bool, typer.Option(help="Overwrite an existing file.")] = False,
) -> None:
    """Write a config template for a new run, generated from the config models."""
    from runctl.config.models import RUN_TYPES
    from runctl.config.template import render_template

    if run_type not in RUN_TYPES:
        raise typer.BadParameter(f"{run_type!r} is not a run type; choose one of {', '.join(RUN_TYPES)}.")
    target = directory / f"{name}.env"
    if target.exists() and not force:
        new_console(stderr=True).print(f"[red]{target} exists[/]; pass --force to overwrite it.")
        raise typer.Exit(1)
    directory.mkdir(parents=True, exist_ok=True)
    target.write_text(render_template(run_type, name))
    new_console().print(f"wrote {target}: fill in the CHANGEME values, then `runctl validate {target}`.")


@app.command()
def validate(
    config: ConfigArg,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    static: Annotated[bool, typer.Option(help="Only checks that need no cluster: no live probes.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Also print the fully expanded launch command.")] = False,
) -> None:
    """Check a config without launching anything. Exit 0: no fatal problem; 1: fatal problems."""
    import json

    from services.validator.library import check_file  # the validator's public face

    resolved, results = check_file(config, live=not static)
    fatal = sum(1 for r in results if r.severity == "fatal")
    command = _launch_command(resolved) if dry_run and resolved is not None else None
    if json_out:
        print(json.dumps({"ok": not fatal, "checks": [r.model_dump() for r in results], "command": command}, indent=2))
    else:
        print_checks(results)
        if command is not None:
            print(command)
    if fatal:
        raise typer.Exit(1)


def _launch_command(resolved: ResolvedConfig) -> str:
    """What the runner would start for this config (the verl command line for ENGINE=verl train runs)."""
    from runctl.config.models import TrainConfig
    from runctl.verl import launch_command

    model = resolved.model
    if isinstance(model, TrainConfig) and model.engine == "verl":
        run_dir = model.output_dir or "$RUNCTL_HOME/runs/<team>/<run_id>"
        return launch_command(model, run_dir, sys.executable)
    return f"# ENGINE={model.engine}: the launcher runs this {resolved.run_type} run in-process; no command line"


async def _watch(
    client: RunctlClient, run_id: str, first_event_timeout_s: float = 10.0, trials: bool = True
) -> str | None:
    """Print a run's events live until it ends; return the final event's name."""
    from runctl.cli.render import event_line
    from runctl.errors import RunNotFoundError

    console = new_console()
    events = client.watch(run_id, include_trials=trials)
    last: str | None = None
    try:
        import asyncio

        first = await asyncio.wait_for(anext(events), first_event_timeout_s)
    except (TimeoutError, StopAsyncIteration):
        raise RunNotFoundError(
            f"no events for run {run_id!r} on the bus within {first_event_timeout_s:.0f}s. "
            "Fix: check the id with `runctl runs`.",
            run_id=run_id,
        ) from None
    console.print(event_line(first))
    last = first.name
    async for event in events:
        console.print(event_line(event))
        last = event.name
    return last


@app.command()
def submit(
    config: ConfigArg,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Follow the run's events until it ends.")] = False,
) -> None:
    """Validate a config and submit the run. With PREFLIGHT_ONLY=1, only validate and publish nothing."""
    resolved = load(config)
    console = new_console()
    flags = resolved.model.preflight_only or resolved.model.dry_run
    if flags and resolved.model.dry_run:
        print(resolved.to_env(), end="")
    results = checks(resolved, live=True)
    refuse_fatal(results, "nothing was published or launched")
    if flags:
        print_checks(results)
    if resolved.model.preflight_only:
        console.print("[green]✓[/] preflight passed (PREFLIGHT_ONLY=1): nothing was published or launched.")
        return
    if resolved.model.dry_run:
        print(_launch_command(resolved))
        engine = resolved.model.engine
        console.print(f"[green]✓[/] checks passed (DRY_RUN=1). It would be submitted as a {resolved.run_type} run")
        console.print(f"  with ENGINE={engine}; nothing was published or launched.")
        return
    if resolved.model.engine == "fake":
        console.print("[magenta]ENGINE=fake[/]: no model runs; every number this run reports is synthetic.")

    async def go() -> str | None:
        async with new_client() as client:
            submitted = await client.submit(resolved, via="cli")
            console.print(f"submitted [bold]{submitted.run_id}[/] (team {submitted.team})")
            if watch:
                return await _watch(client, submitted.run_id)
            return None

    final = run_sync(go)
    if final in ("run.failed", "config.rejected"):
        raise typer.Exit(1)


@app.command("run")
def run_command(
    config: ConfigArg,
    run_id: Annotated[
        str | None,
        typer.Option("--run-id", help="The run's id (default: a new one); the id of a killed run resumes it."),
    ] = None,
) -> None:
    """Run a config here, in the foreground, with a live progress display (no stack needed). Infer and eval runs
    with ENGINE=local start Ray, vLLM and the proxy themselves; results go to the run folder it prints.
    Ctrl-C cancels cleanly; `--run-id ID` resumes a run that was killed, without redoing finished trials."""
    resolved = load(config)
    results = checks(resolved, live=False, host=True)
    refuse_fatal(results, "nothing was launched")
    if resolved.model.preflight_only or resolved.model.dry_run:
        if resolved.model.dry_run:
            print(resolved.to_env(), end="")
        print_checks(results)
        flag = "PREFLIGHT_ONLY=1" if resolved.model.preflight_only else "DRY_RUN=1"
        new_console().print(f"[green]✓[/] checks passed ({flag}): nothing was launched.")
        return
    from runctl.cli.progress import run_with_progress

    final = run_sync(lambda: run_with_progress(resolved, results, run_id, new_console()))
    if final != "run.succeeded":
        raise typer.Exit(1)


@app.command()
def watch(
    run_id: RunArg,
    trials: Annotated[bool, typer.Option(help="Show every trial.finished (hundreds per step on a real run).")] = True,
) -> None:
    """Show a run's events live, from its beginning until it ends."""

    async def go() -> str | None:
        async with new_client() as client:
            return await _watch(client, run_id, trials=trials)

    final = run_sync(go)
    if final in ("run.failed", "config.rejected"):
        raise typer.Exit(1)


@app.command()
def runs(
    team: Annotated[str | None, typer.Option(help="Only this team's runs.")] = None,
    state: Annotated[str | None, typer.Option(help="Only runs in this state.")] = None,
    run_type: Annotated[str | None, typer.Option("--type", help="train, eval or infer.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 50,
) -> None:
    """List runs recorded by the tracker, newest first."""
    from runctl.cli.render import runs_table

    async def go() -> dict[str, Any]:
        async with new_client() as client:
            return await client.list_runs(team=team, state=state, run_type=run_type, limit=limit)

    result = run_sync(go)
    console = new_console()
    if not result["runs"]:
        console.print("no runs recorded yet")
        return
    console.print(runs_table(result["runs"]))
    if result["total"] > len(result["runs"]):
        console.print(f"[dim]{len(result['runs'])} of {result['total']} shown[/]")


@app.command()
def show(
    run_id: RunArg,
    json_out: Annotated[bool, typer.Option("--json", help="The tracker's record as JSON.")] = False,
) -> None:
    """Show one run: its state, outcome and every event in order."""
    import json

    from runctl.cli.render import describe, runs_table
    from runctl.events.payloads import BY_TYPE

    async def go() -> dict[str, Any]:
        async with new_client() as client:
            return await client.get_run(run_id)

    record = run_sync(go)
    if json_out:
        print(json.dumps(record, indent=2))
        return
    console = new_console()
    console.print(runs_table([record["run"]]))
    if record["run"].get("error"):
        console.print(f"[red]error[/]: {escape(json.dumps(record['run']['error']))}")
    for event in record.get("events", []):
        payload = BY_TYPE[event["type"]].model_validate(event["data"])
        console.print(f"  [dim]{event['time'][11:23]}[/]  {event['name']:<17} {escape(describe(payload))}")


@app.command()
def usage(
    team: Annotated[str | None, typer.Option(help="Only this team.")] = None,
    since: Annotated[
        str | None, typer.Option(help="Count only what was used from then on: an ISO 8601 date or time (UTC).")
    ] = None,
    runs: Annotated[bool, typer.Option("--runs", help="Also each run's usage.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="The tracker's answer as JSON.")] = False,
) -> None:
    """What each team used: GPU-hours by role (rollout, training, eval), CPU-hours, sandbox-minutes, tokens."""
    import json

    from runctl.cli.render import usage_table

    if since is not None:
        from datetime import datetime

        try:
            datetime.fromisoformat(since)
        except ValueError:
            raise typer.BadParameter(f"{since!r} is not a date or time. Fix: e.g. --since 2026-12-01") from None

    async def go() -> dict[str, Any]:
        async with new_client() as client:
            return await client.usage(team=team, since=since)

    result = run_sync(go)
    if json_out:
        print(json.dumps(result, indent=2))
        return
    console = new_console()
    console.print(f"usage {'since ' + result['since'] if result['since'] else 'of all time'}, until {result['now']}")
    if not result["teams"]:
        console.print("nothing used yet" + (f" by team {team}" if team else ""))
        return
    console.print(usage_table(result["teams"], "team"))
    if runs:
        console.print(usage_table(result["runs"], "run_id"))


@app.command()
def cancel(
    run_id: RunArg,
    team: Annotated[str | None, typer.Option(help="The run's team (looked up in the tracker if not given).")] = None,
    reason: Annotated[str, typer.Option(help="Why, for the record.")] = "",
) -> None:
    """Ask the launcher to cancel a run."""

    async def go() -> None:
        async with new_client() as client:
            await client.cancel(run_id, team=team, reason=reason)

    run_sync(go)
    new_console().print(f"cancel requested for {run_id}; `runctl watch {run_id}` shows when it stops.")
