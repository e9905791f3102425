"""``runctl run``'s live display: the phase, trials done of all, the pass rate so far and the time left; the
run's events as lines above it; at the end its figures, where its results are, its error if it failed, and whether
the tracker recorded it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from runctl.cli.render import event_line
from runctl.config import TrainConfig
from runctl.events import ConfigValidated, Event, PhaseStarted, RunFailed, RunSucceeded, TrialFinished

if TYPE_CHECKING:
    from runctl.bus import Bus
    from runctl.config.loader import ResolvedConfig
    from runctl.events.checks import CheckResult

QUIET_EVENTS = ("trial.finished",)


async def stack_bus() -> tuple[Bus | None, str]:
    """The bus a foreground run is published on: ``RUNCTL_NATS_URL`` when set, else the embedded stack's when it is
    up; and, when there is none (or it does not answer), why, for the run's last line."""
    from runctl.bus import Bus
    from runctl.bus.client import masked_url
    from runctl.errors import BusError, BusUnreachableError
    from runctl.home import is_same_process, read_stack_state

    url = os.environ.get("RUNCTL_NATS_URL")
    if not url:
        state = read_stack_state()
        if state is None or not is_same_process(state.supervisor):
            return None, "no runctl stack is up"
        url = state.nats_url
    try:
        bus = await Bus.connect(url, name="runctl-run")
    except BusUnreachableError:
        return None, f"the bus at {masked_url(url)} does not answer"
    import nats.errors
    import nats.js.errors

    try:
        await bus.ensure_streams()
    except (BusError, nats.errors.Error, nats.js.errors.Error, TimeoutError) as e:
        await bus.close()
        return None, f"the bus at {masked_url(url)} refused its streams ({type(e).__name__})"
    return bus, ""


async def run_with_progress(
    resolved: ResolvedConfig, checks: list[CheckResult], run_id: str | None, console: Console
) -> str:
    """Carry the run in the foreground, published on the stack's bus when one is up; return its end event's name."""
    from runctl.sdk import new_run_id, submission_event, tracker_url
    from services.launcher.library import BusMirror, run_foreground

    config = resolved.model
    run_id = run_id or new_run_id(config.exp_name)
    counts = {"completed": 0, "passes": 0}
    progress = Progress(
        TextColumn("[bold]{task.fields[phase]:<8}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("trials  pass rate {task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
    bar = progress.add_task("run", total=None, phase="resolve", rate="—")

    def observe(event: Event) -> None:
        data = event.data
        if isinstance(data, PhaseStarted):
            progress.update(bar, phase=data.phase)
        if isinstance(data, TrialFinished):
            progress.advance(bar)
            if data.reward is not None:
                counts["completed"] += 1
                counts["passes"] += int(data.reward >= 1.0)
                progress.update(bar, rate=f"{counts['passes'] / counts['completed']:.2f}")
        if event.name not in QUIET_EVENTS:
            progress.console.print(event_line(event))

    def started(done: int, total: int) -> None:
        progress.update(bar, total=total, completed=done)

    bus, why_not = await stack_bus()
    if bus is None and isinstance(config, TrainConfig) and config.eval_on_checkpoint:
        from runctl.errors import StackError

        raise StackError(
            f"EVAL_ON_CHECKPOINT=1: the stack's launcher submits the eval run of each checkpoint, and {why_not}, so "
            "no checkpoint of this run would be scored. Fix: `runctl up` first, or set EVAL_ON_CHECKPOINT=0."
        )
    mirror = BusMirror(bus) if bus is not None else None
    opening = [submission_event(resolved, via="foreground", run_id=run_id).data, ConfigValidated(checks=checks)]
    console.print(f"run [bold]{run_id}[/] ({config.run_type}, ENGINE={config.engine})")
    try:
        with progress:
            end, run_dir = await run_foreground(
                config, run_id, observe, started, opening=opening, mirror=mirror, secret_values=resolved.secret_values
            )
    finally:
        if bus is not None:
            await bus.close()
    if isinstance(end.data, RunSucceeded):
        _figures(console, end.data.summary)
    console.print(f"results: [bold]{run_dir}[/]")
    if isinstance(end.data, RunFailed):
        console.print(f"[red]{end.data.error_type}[/]: {_escape(end.data.message)}", highlight=False)
    if mirror is None:
        console.print(
            f"the tracker did not record this run ({why_not}): start the stack with `runctl up` before `runctl run`, "
            f"or publish it now with `runctl tracker import {run_dir}` once it is up.",
            highlight=False,
        )
    elif mirror.lost_at is not None:
        console.print(
            f"the tracker's record of this run stops at {mirror.lost_at} (the bus stopped answering): once it is back, "
            f"`runctl tracker import {run_dir}` publishes the rest.",
            highlight=False,
        )
    else:
        console.print(f"recorded by the tracker: `runctl show {run_id}`, or {tracker_url()}/runs/{run_id}")
    return end.name


def _escape(text: str) -> str:
    return text.replace("[", "\\[")


def _figures(console: Console, summary: dict[str, Any]) -> None:
    ci = summary.get("pass@1_ci95")
    if summary.get("pass@1") is not None and ci:
        console.print(f"pass@1 {summary['pass@1']:.3f}  (95% CI {ci[0]:.3f}–{ci[1]:.3f})", highlight=False)
    ks = [f"{k} {v:.3f}" for k, v in summary.items() if k.startswith("pass@") and k != "pass@1" and "_" not in k]
    if ks:
        console.print("  ".join(ks), highlight=False)
    if "distribution" in summary:
        d = summary["distribution"]
        console.print(
            f"tasks: {d['all-pass']} all-pass, {d['partial']} partial, {d['all-fail']} all-fail"
            + (f", {d['no-result']} without a result" if d.get("no-result") else ""),
            highlight=False,
        )
    if "filtered_index" in summary:
        console.print(f"kept {summary['kept']} task(s) → {summary['filtered_index']}", highlight=False)
    if summary.get("summary_csv"):
        console.print(f"summary: {summary['summary_csv']}", highlight=False)
