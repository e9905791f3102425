"""The embedded stack: start it (``up``), stop it (``down``), its health (``status``), the demos that run on it, and the
dashboard's URL.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from runctl.cli.app import app, escape, new_client, new_console, run_sync, runctl_home


@app.command()
def up(
    nats_port: Annotated[int, typer.Option(help="Port of the embedded nats-server.", envvar="RUNCTL_NATS_PORT")] = 4222,
    tracker_port: Annotated[int, typer.Option(help="Port of the tracker API.", envvar="RUNCTL_TRACKER_PORT")] = 8750,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for every service to answer.", envvar="RUNCTL_UP_TIMEOUT")
    ] = 60.0,
) -> None:
    """Start the embedded stack: nats-server with JetStream and the five services, supervised. If it already runs
    from $RUNCTL_HOME, show its status instead."""
    from runctl import stack
    from runctl.home import is_same_process, read_stack_state

    base = runctl_home()
    console = new_console()
    running = read_stack_state(base)
    if running is not None and is_same_process(running.supervisor):
        console.print(f"stack already up in {base}: bus {running.nats_url}, tracker {running.tracker_url}")
        if not _print_status(running.nats_url, running.children):
            raise typer.Exit(1)
        return
    state = stack.start(base, nats_port, tracker_port, timeout)
    console.print(f"[green]stack up[/] in {base}: bus {state.nats_url}, tracker {state.tracker_url}")
    _print_status(state.nats_url, state.children)


@app.command()
def down() -> None:
    """Stop the embedded stack started from $RUNCTL_HOME: exactly the processes it recorded."""
    from runctl import stack

    stopped = stack.stop(runctl_home())
    if not stopped:
        new_console().print(f"no stack recorded in {runctl_home()}")
        return
    new_console().print("stopped " + ", ".join(stopped))


def _print_status(nats_url: str, children: dict[str, Any]) -> bool:
    from rich.table import Table

    from runctl import stack

    health = run_sync(lambda: stack.probe(nats_url, children))
    table = Table(box=None, pad_edge=False)
    for column in ("component", "pid", "health", "restarts", "detail"):
        table.add_column(column)
    for name, info in health.items():
        mark = "[green]ok[/]" if info.get("ok") else "[red]down[/]"
        table.add_row(name, str(info.get("pid") or "—"), mark, str(info.get("restarts", 0)), escape(info["detail"]))
    new_console().print(table)
    return all(info.get("ok") for info in health.values())


@app.command()
def status() -> None:
    """Health of the bus and of every service: the embedded stack's, or the cluster's at RUNCTL_NATS_URL."""
    from runctl.home import is_same_process, read_stack_state

    console = new_console()
    explicit = os.environ.get("RUNCTL_NATS_URL")
    state = read_stack_state()
    if explicit and (state is None or state.nats_url != explicit):
        from runctl.bus.client import masked_url

        console.print(f"bus {masked_url(explicit)} (RUNCTL_NATS_URL)")
        if not _print_status(explicit, {}):
            raise typer.Exit(1)
        return
    if state is None:
        console.print(
            f"no stack recorded in {runctl_home()}. Fix: `runctl up`, or set RUNCTL_NATS_URL to a cluster's bus."
        )
        raise typer.Exit(1)
    alive = is_same_process(state.supervisor)
    mark = "[green]running[/]" if alive else "[red]not running[/]"
    console.print(f"supervisor PID {state.supervisor.pid}: {mark}")
    if not _print_status(state.nats_url, state.children) or not alive:
        raise typer.Exit(1)


@app.command()
def demo(
    config: Annotated[Path, typer.Argument(help="Config to run.")] = Path("configs/examples/preview.env"),
    cpu: Annotated[
        bool,
        typer.Option(
            "--cpu",
            help="Instead: infer → train on the filtered index → an eval run on every checkpoint, for real on CPU "
            "(what ./scripts/demo.sh runs); prints every checkpoint's pass@1 beside the base model's.",
        ),
    ] = False,
    gpu: Annotated[
        bool,
        typer.Option(
            "--gpu",
            help="Instead: two GRPO steps through verl on one GPU with an eval run on every checkpoint (what "
            "./scripts/gpu_smoke.sh runs); prints the events, the step times and the scores.",
        ),
    ] = False,
) -> None:
    """Bring the stack up if needed, submit the preview example and follow it to the end."""
    from runctl import stack
    from runctl.home import is_same_process, read_stack_state

    base = runctl_home()
    state = read_stack_state(base)
    if state is None or not is_same_process(state.supervisor):
        ports = (
            int(os.environ.get("RUNCTL_NATS_PORT", stack.DEFAULT_NATS_PORT)),
            int(os.environ.get("RUNCTL_TRACKER_PORT", stack.DEFAULT_TRACKER_PORT)),
        )
        state = stack.start(base, *ports)
        new_console().print(f"[green]stack up[/] in {base}: bus {state.nats_url}, tracker {state.tracker_url}")
    if cpu or gpu:
        from runctl.cli.cpudemo import Demo
        from runctl.cli.gpusmoke import GpuSmoke

        kind = GpuSmoke if gpu else Demo

        async def go() -> int:
            async with new_client() as client:
                return await kind(client, new_console(), base / "demo").run()

        run_sync(go)
        return
    from runctl.cli.runs import submit

    submit(config, watch=True)


@app.command()
def dashboard(
    open_browser: Annotated[bool, typer.Option("--open", help="Also open it in the default browser.")] = False,
) -> None:
    """Print the dashboard's URL (the tracker serves it), after checking that the tracker answers. With --open, the
    browser gets your token too (in the link's #fragment, which is never sent over the network in the URL)."""
    from urllib.parse import quote

    from runctl.sdk import api_token, dashboard_url

    url = dashboard_url()
    print(url)
    if open_browser:
        import webbrowser

        token = api_token()
        webbrowser.open(url + (f"#token={quote(token, safe='')}" if token else ""))
