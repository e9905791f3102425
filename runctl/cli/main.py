"""The ``runctl`` command. Imports here stay light so ``runctl --help`` answers at once; each command imports
what it needs. Errors: commands let a RunctlError propagate; ``main`` is the one place that catches it and prints
one red ``ErrorType: message`` line (a config error lists every problem), then exits 1. Usage errors exit 2.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from runctl.config.loader import ResolvedConfig
    from runctl.sdk import RunctlClient

app = typer.Typer(
    name="runctl",
    help="Control plane for agentic RL runs: validate, submit, watch and cancel train, eval and infer runs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

T = TypeVar("T")
ConfigArg = Annotated[Path, typer.Argument(help="The run's .env config.", show_default=False)]
RunArg = Annotated[str, typer.Argument(help="Run id, as printed by `runctl submit` or `runctl runs`.")]


def _console(stderr: bool = False) -> Console:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 200
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)


def _run(coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to its end (errors reach ``main``, the one place that reports them)."""
    import asyncio  # here, not at the top: it costs a tenth of a second that `--help` need not pay

    return asyncio.run(coro_fn())


def _escape(text: str) -> str:
    return text.replace("[", "\\[")


def _client() -> RunctlClient:
    from runctl.sdk import RunctlClient

    return RunctlClient()


def _home() -> Path:
    from runctl.home import home

    return home()


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
        _console(stderr=True).print(f"[red]{target} exists[/]; pass --force to overwrite it.")
        raise typer.Exit(1)
    directory.mkdir(parents=True, exist_ok=True)
    target.write_text(render_template(run_type, name))
    _console().print(f"wrote {target}: fill in the CHANGEME values, then `runctl validate {target}`.")


def _load(config: Path) -> ResolvedConfig:
    from runctl.config.loader import load_config

    return load_config(config)


def _checks(resolved: ResolvedConfig, live: bool, host: bool = False) -> list[Any]:
    """Every check of a resolved config (the validator's public face): live probes, and probes of this machine."""
    from services.validator.library import check_resolved

    return check_resolved(resolved, live, host)


def _print_checks(results: list[Any]) -> int:
    """One line per check and a summary; returns the number of fatal results."""
    from runctl.cli.checklines import colours_on, render

    text, fatal = render(results, colours_on(sys.stdout))
    sys.stdout.write(text)
    return fatal


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
        _print_checks(results)
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

    console = _console()
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
    resolved = _load(config)
    console = _console()
    flags = resolved.model.preflight_only or resolved.model.dry_run
    if flags and resolved.model.dry_run:
        print(resolved.to_env(), end="")
    results = _checks(resolved, live=True)
    _refuse_fatal(results, "nothing was published or launched")
    if flags:
        _print_checks(results)
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
        async with _client() as client:
            submitted = await client.submit(resolved, via="cli")
            console.print(f"submitted [bold]{submitted.run_id}[/] (team {submitted.team})")
            if watch:
                return await _watch(client, submitted.run_id)
            return None

    final = _run(go)
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
    resolved = _load(config)
    results = _checks(resolved, live=False, host=True)
    _refuse_fatal(results, "nothing was launched")
    if resolved.model.preflight_only or resolved.model.dry_run:
        if resolved.model.dry_run:
            print(resolved.to_env(), end="")
        _print_checks(results)
        flag = "PREFLIGHT_ONLY=1" if resolved.model.preflight_only else "DRY_RUN=1"
        _console().print(f"[green]✓[/] checks passed ({flag}): nothing was launched.")
        return
    from runctl.cli.progress import run_with_progress

    final = _run(lambda: run_with_progress(resolved, results, run_id, _console()))
    if final != "run.succeeded":
        raise typer.Exit(1)


def _refuse_fatal(results: list[Any], what: str) -> None:
    """Print the checks and raise when any is fatal.

    Raises:
        ChecksFailedError: naming the fatal checks.
    """
    from runctl.errors import ChecksFailedError

    fatal = [(r.id, r.message, r.fix) for r in results if r.severity == "fatal"]
    if fatal:
        _print_checks(results)
        raise ChecksFailedError(fatal, what)


@app.command()
def watch(
    run_id: RunArg,
    trials: Annotated[bool, typer.Option(help="Show every trial.finished (hundreds per step on a real run).")] = True,
) -> None:
    """Show a run's events live, from its beginning until it ends."""

    async def go() -> str | None:
        async with _client() as client:
            return await _watch(client, run_id, trials=trials)

    final = _run(go)
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
        async with _client() as client:
            return await client.list_runs(team=team, state=state, run_type=run_type, limit=limit)

    result = _run(go)
    console = _console()
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
        async with _client() as client:
            return await client.get_run(run_id)

    record = _run(go)
    if json_out:
        print(json.dumps(record, indent=2))
        return
    console = _console()
    console.print(runs_table([record["run"]]))
    if record["run"].get("error"):
        console.print(f"[red]error[/]: {_escape(json.dumps(record['run']['error']))}")
    for event in record.get("events", []):
        payload = BY_TYPE[event["type"]].model_validate(event["data"])
        console.print(f"  [dim]{event['time'][11:23]}[/]  {event['name']:<17} {_escape(describe(payload))}")


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
        async with _client() as client:
            return await client.usage(team=team, since=since)

    result = _run(go)
    if json_out:
        print(json.dumps(result, indent=2))
        return
    console = _console()
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
        async with _client() as client:
            await client.cancel(run_id, team=team, reason=reason)

    _run(go)
    _console().print(f"cancel requested for {run_id}; `runctl watch {run_id}` shows when it stops.")


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

    base = _home()
    console = _console()
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

    stopped = stack.stop(_home())
    if not stopped:
        _console().print(f"no stack recorded in {_home()}")
        return
    _console().print("stopped " + ", ".join(stopped))


def _print_status(nats_url: str, children: dict[str, Any]) -> bool:
    from rich.table import Table

    from runctl import stack

    health = _run(lambda: stack.probe(nats_url, children))
    table = Table(box=None, pad_edge=False)
    for column in ("component", "pid", "health", "restarts", "detail"):
        table.add_column(column)
    for name, info in health.items():
        mark = "[green]ok[/]" if info.get("ok") else "[red]down[/]"
        table.add_row(name, str(info.get("pid") or "—"), mark, str(info.get("restarts", 0)), _escape(info["detail"]))
    _console().print(table)
    return all(info.get("ok") for info in health.values())


@app.command()
def status() -> None:
    """Health of the bus and of every service: the embedded stack's, or the cluster's at RUNCTL_NATS_URL."""
    from runctl.home import is_same_process, read_stack_state

    console = _console()
    explicit = os.environ.get("RUNCTL_NATS_URL")
    state = read_stack_state()
    if explicit and (state is None or state.nats_url != explicit):
        from runctl.bus.client import masked_url

        console.print(f"bus {masked_url(explicit)} (RUNCTL_NATS_URL)")
        if not _print_status(explicit, {}):
            raise typer.Exit(1)
        return
    if state is None:
        console.print(f"no stack recorded in {_home()}. Fix: `runctl up`, or set RUNCTL_NATS_URL to a cluster's bus.")
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

    base = _home()
    state = read_stack_state(base)
    if state is None or not is_same_process(state.supervisor):
        ports = (
            int(os.environ.get("RUNCTL_NATS_PORT", stack.DEFAULT_NATS_PORT)),
            int(os.environ.get("RUNCTL_TRACKER_PORT", stack.DEFAULT_TRACKER_PORT)),
        )
        state = stack.start(base, *ports)
        _console().print(f"[green]stack up[/] in {base}: bus {state.nats_url}, tracker {state.tracker_url}")
    if cpu or gpu:
        from runctl.cli.cpudemo import Demo
        from runctl.cli.gpusmoke import GpuSmoke

        kind = GpuSmoke if gpu else Demo

        async def go() -> int:
            async with _client() as client:
                return await kind(client, _console(), base / "demo").run()

        _run(go)
        return
    submit(config, watch=True)


task_app = typer.Typer(help="Harbor-format tasks: run one trial, or check that a task is sound.", no_args_is_help=True)
app.add_typer(task_app, name="task")
TaskDirArg = Annotated[Path, typer.Argument(help="A Harbor task folder (task.toml, instruction.md, tests/test.sh).")]
BackendOpt = Annotated[str, typer.Option("--backend", help="Sandbox backend: docker or local (kubernetes: a cluster).")]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Trial folder (default: under $RUNCTL_HOME/task-runs).")]


def _task_out(task_dir: Path, what: str, out: Path | None) -> Path:
    from datetime import UTC, datetime

    if out is not None:
        return out
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    return _home() / "task-runs" / f"{task_dir.resolve().name}-{what}-{stamp}"


@task_app.command("run")
def task_run(
    task_dir: TaskDirArg,
    agent: Annotated[str, typer.Option("--agent", help="Built-in agent: oracle (runs solution/solve.sh) or nop.")],
    backend: BackendOpt = "docker",
    json_out: Annotated[bool, typer.Option("--json", help="Print the trial result as JSON.")] = False,
    out: OutOpt = None,
) -> None:
    """Run one trial of a task: sandbox, agent, verifier. Prints the reward, how the trial ended, and timings."""
    from services.sandbox.library import run_task

    folder = _task_out(task_dir, agent, out)
    result = run_task(task_dir, agent, backend, folder)  # type: ignore[arg-type]
    if json_out:
        print(result.model_dump_json(indent=2))
        return
    reward = "none (verifier error)" if result.reward is None else f"{result.reward:g}"
    console = _console()
    console.print(f"[bold]{result.task_id}[/] agent={result.agent} backend={result.backend}: reward {reward}")
    console.print(f"  ended: {result.termination_reason}")
    if result.failure is not None:
        console.print(f"  [yellow]{result.failure.cause}[/]: {_escape(result.failure.message)}")
    console.print("  " + ", ".join(f"{k} {v:.2f} s" for k, v in result.timings_s.items()))
    console.print(f"  trial folder: {folder}")


@task_app.command("check")
def task_check(task_dir: TaskDirArg, backend: BackendOpt = "docker", out: OutOpt = None) -> None:
    """Check a task is sound: the oracle must score 1 and nop 0. Exit 1 when it is not."""
    from services.sandbox.library import check_task

    folder = _task_out(task_dir, "check", out)
    verdict = check_task(task_dir, backend, folder)  # type: ignore[arg-type]
    console = _console()
    for result in (verdict.oracle, verdict.nop):
        console.print(f"  {result.agent}: reward {result.reward} ({result.termination_reason})")
    if verdict.sound:
        console.print(f"[green]sound[/]: {verdict.oracle.task_id} (trials under {folder})")
        return
    console.print(f"[red]not sound[/]: {'; '.join(verdict.problems())} (trials under {folder})")
    raise typer.Exit(1)


proxy_app = typer.Typer(
    help="The model proxy: per-session OpenAI and Anthropic endpoints before vLLM.", no_args_is_help=True
)
app.add_typer(proxy_app, name="proxy")


@proxy_app.command("serve")
def proxy_serve(
    upstream: Annotated[
        list[str] | None,
        typer.Option("--upstream", help="A vLLM replica, http://HOST:PORT; repeat for several.", show_default=False),
    ] = None,
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free one).")] = 8760,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    trajectory_dir: Annotated[
        Path | None, typer.Option("--trajectory-dir", help="Write each closed session's trajectory here.")
    ] = None,
    discover_ray: Annotated[
        bool, typer.Option("--discover-ray", help="Also use the Ray cluster's vllm_server_* actors as replicas.")
    ] = False,
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="Ray cluster for --discover-ray (default: RAY_ADDRESS).")
    ] = None,
    served_model: Annotated[
        str | None, typer.Option("--served-model", help="The served model name (default: asked of the replicas).")
    ] = None,
    alias: Annotated[
        list[str] | None,
        typer.Option(
            "--alias",
            help="A model name (or fnmatch pattern) that means the served model; repeatable. Default: claude-*.",
        ),
    ] = None,
    advertise_host: Annotated[
        str | None, typer.Option("--advertise-host", help="Host to put in session URLs (default: --host).")
    ] = None,
) -> None:
    """Serve the proxy until Ctrl-C. Sessions are made with the admin API (see docs/services.md)."""
    import asyncio

    from services.proxy.replicas import parse_upstream
    from services.proxy.server import DEFAULT_ALIASES
    from services.proxy.standalone import serve, use_fast_loop

    upstreams = upstream or []
    if not upstreams and not discover_ray:
        raise typer.BadParameter("give at least one --upstream http://HOST:PORT, or --discover-ray.")
    for url in upstreams:
        try:
            parse_upstream(url)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--upstream") from None
    use_fast_loop()
    asyncio.run(
        serve(
            upstreams,
            host=host,
            port=port,
            advertise_host=advertise_host,
            trajectory_dir=trajectory_dir,
            served_model=served_model,
            aliases=tuple(alias) if alias else DEFAULT_ALIASES,
            discover_ray=discover_ray,
            ray_address=ray_address,
        )
    )


team_app = typer.Typer(
    help="Teams of a shared cluster (admin): quotas, fair-share weight and the token each team connects with.",
    no_args_is_help=True,
)
app.add_typer(team_app, name="team")
_NO_QUOTA = " Not given: no quota of its own (the cluster's size bounds it); inf removes one."
GpusOpt = Annotated[float | None, typer.Option(help="GPUs the team may hold at once." + _NO_QUOTA)]
CpusOpt = Annotated[float | None, typer.Option(help="CPUs the team's CPU runs may hold at once." + _NO_QUOTA)]
SandboxesOpt = Annotated[float | None, typer.Option(help="Sandboxes the team may hold at once." + _NO_QUOTA)]
WeightOpt = Annotated[float, typer.Option(help="The team's fair share of the cluster against the others'.")]
TeamArg = Annotated[str, typer.Argument(help="The team's name.", show_default=False)]


async def _registry_call(work: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
    """``work`` on the team registry; on the embedded stack, returns once its bus has taken the change."""
    from runctl.stackbus import wait_applied
    from runctl.teams import TeamRegistry

    async with _client() as client:
        bus = await client.bus()
        registry = TeamRegistry(bus)
        result = await work(registry)
        await wait_applied(bus.url, await registry.sequence())
        return result


def _print_token(name: str, token: str, what: str) -> None:
    console = _console()
    console.print(f"[green]{what}[/] team {name}. Its token, shown this once (keep it secret; rotate it if it leaks):")
    console.print(f"  RUNCTL_TOKEN={token}")
    console.print(f"  bus credentials: user {name}, password the token; RUNCTL_NATS_INBOX_PREFIX=_INBOX_{name}")


@team_app.command("add")
def team_add(
    name: TeamArg, gpus: GpusOpt = None, cpus: CpusOpt = None, sandboxes: SandboxesOpt = None, weight: WeightOpt = 1.0
) -> None:
    """Add a team with its quotas and weight; prints its token once."""
    team, token = _run(lambda: _registry_call(lambda r: r.add(name, gpus, cpus, sandboxes, weight)))
    _print_token(team.name, token, "added")


@team_app.command("list")
def team_list() -> None:
    """Every team with its quotas and weight (never a token); '-' is no quota."""
    from rich.table import Table

    from runctl.teams import quota_text

    teams = _run(lambda: _registry_call(lambda r: r.all()))
    table = Table(box=None, pad_edge=False)
    for column in ("team", "gpus", "cpus", "sandboxes", "weight"):
        table.add_column(column)
    for team in teams:
        table.add_row(team.name, *map(quota_text, (team.gpus, team.cpus, team.sandboxes)), f"{team.weight:g}")
    _console().print(table if teams else "no teams yet: `runctl team add NAME` adds one")


@team_app.command("set")
def team_set(
    name: TeamArg,
    gpus: GpusOpt = None,
    cpus: CpusOpt = None,
    sandboxes: SandboxesOpt = None,
    weight: Annotated[float | None, typer.Option(help="The team's fair share against the others'.")] = None,
) -> None:
    """Change a team's quotas or weight."""
    from runctl.teams import quota_text

    changes = {
        k: v for k, v in (("gpus", gpus), ("cpus", cpus), ("sandboxes", sandboxes), ("weight", weight)) if v is not None
    }
    if not changes:
        raise typer.BadParameter("give at least one of --gpus, --cpus, --sandboxes, --weight")
    team = _run(lambda: _registry_call(lambda r: r.update(name, **changes)))
    quotas = ", ".join(f"{k} {quota_text(getattr(team, k))}" for k in ("gpus", "cpus", "sandboxes"))
    _console().print(f"team {team.name}: {quotas}, weight {team.weight:g}")


@team_app.command("rotate")
def team_rotate(name: TeamArg) -> None:
    """Give a team a new token; the old one stops working. Prints the new token once."""
    team, token = _run(lambda: _registry_call(lambda r: r.rotate(name)))
    _print_token(team.name, token, "rotated the token of")


@team_app.command("remove")
def team_remove(name: TeamArg) -> None:
    """Remove a team: its token stops working. Its runs and their records stay."""
    _run(lambda: _registry_call(lambda r: r.remove(name)))
    _console().print(f"removed team {name}")


@team_app.command("nats-config")
def team_nats_config(
    out: Annotated[Path, typer.Option(help="Where to write nats-server's configuration (mode 0600).")],
    listen: Annotated[str, typer.Option(help="host:port nats-server listens on.")] = "127.0.0.1:4222",
    store: Annotated[Path, typer.Option(help="Where JetStream keeps its streams.")] = Path("/var/lib/runctl/jetstream"),
    bootstrap: Annotated[
        bool, typer.Option(help="The services and the admin only, without the registry: the first start of the bus.")
    ] = False,
) -> None:
    """Write nats-server's configuration from the team registry: the services' user (password from
    $RUNCTL_SERVICES_PASSWORD), the admin (from $RUNCTL_ADMIN_PASSWORD), and each team's user with its permissions.
    Reload nats-server after (SIGHUP): a removed team or a rotated token is cut off within seconds."""
    import bcrypt

    from runctl.errors import RunctlError
    from runctl.natsauth import ADMIN_USER, SERVICES_USER, NatsUser, server_config
    from runctl.stackbus import write_private

    passwords = {}
    for user, variable in ((SERVICES_USER, "RUNCTL_SERVICES_PASSWORD"), (ADMIN_USER, "RUNCTL_ADMIN_PASSWORD")):
        if not os.environ.get(variable):
            raise RunctlError(f"${variable} is not set, so the {user} user would have no password. Fix: set it.")
        passwords[user] = bcrypt.hashpw(os.environ[variable].encode(), bcrypt.gensalt()).decode()
    teams = [] if bootstrap else _run(lambda: _registry_call(lambda r: r.all()))
    text = server_config(
        listen,
        str(store),
        NatsUser(SERVICES_USER, passwords[SERVICES_USER]),
        NatsUser(ADMIN_USER, passwords[ADMIN_USER]),
        [NatsUser(t.name, t.nats_bcrypt) for t in teams],
    )
    write_private(out, text)
    _console().print(f"wrote {out}: {len(teams)} team(s). Reload nats-server to apply it (kill -HUP <its pid>).")


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
    from services.tracker.db import make_engine
    from services.tracker.rebuild import rebuild
    from services.tracker.service import db_url

    url = db or db_url()

    async def go() -> Any:
        bus = await Bus.connect(None)
        try:
            return await rebuild(bus, make_engine(url))
        finally:
            await bus.close()

    report = _run(go)
    console = _console()
    read = ", ".join(f"{count} from {stream}" for stream, count in report.streams.items())
    console.print(f"[green]rebuilt[/] {url.split('?')[0]}: {report.stored} events stored ({read})")
    for reason in report.skipped:
        console.print(f"[yellow]skipped[/] {_escape(reason)}")


@tracker_app.command("import")
def tracker_import(
    run_dir: Annotated[Path, typer.Argument(help="A run folder that `runctl run` wrote (it holds events.jsonl).")],
) -> None:
    """Publish a foreground run's recorded events (events.jsonl) on the bus, so the tracker records the run. Events
    the bus already has are dropped by their ids: importing twice, or after a partial record, is safe."""
    from runctl.sdk import import_events

    async def go() -> tuple[int, int]:
        async with _client() as client:
            return await import_events(client, run_dir)

    published, total = _run(go)
    _console().print(f"published {published} of the {total} events in {run_dir / 'events.jsonl'}")


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


def main() -> None:
    """Console entry point."""
    # Pydantic would scan every installed distribution's entry points for plugins (~80 ms a start with a full
    # environment); runctl uses none. Setting PYDANTIC_DISABLE_PLUGINS yourself (even empty) keeps your choice.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    from runctl.errors import RunctlError

    try:
        app()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except RunctlError as e:
        report(e)
        code = 1
    except OSError as e:  # the machine's, not a bug: a folder not writable, a disk full; its message names the path
        report(e)
        code = 1
    except KeyboardInterrupt:
        _console(stderr=True).print("interrupted")
        code = 130
    _exit_now(code)


def report(error: Exception) -> None:
    """The one way the CLI reports an error: a config error lists every problem; any other is one red line."""
    from runctl.errors import ConfigError, RunctlError

    console = _console(stderr=True)
    if isinstance(error, ConfigError):
        from runctl.cli.render import print_config_error

        print_config_error(console, error)
        return
    message = error.message if isinstance(error, RunctlError) else str(error)
    console.print(f"[red]{type(error).__name__}[/]: {_escape(message)}")


def _exit_now(code: int) -> None:
    """Exit as the interpreter would, less tearing down every module (~30 ms with pydantic loaded).

    Exit handlers run and the standard streams are flushed first, so nothing a command wrote or registered is lost.
    """
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
