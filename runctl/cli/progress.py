"""``runctl run``'s live display: the phase, trials done of all, the pass rate so far and the time left; the
run's events as lines above it; its figures and where its results are at the end."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from runctl.cli.render import event_line
from runctl.config import RunConfig
from runctl.events import Event, PhaseStarted, RunSucceeded, TrialFinished

QUIET_EVENTS = ("trial.finished",)


async def run_with_progress(config: RunConfig, run_id: str, console: Console) -> str:
    """Carry the run in the foreground; return the name of its end event."""
    from services.launcher.foreground import run_foreground

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

    console.print(f"run [bold]{run_id}[/] ({config.run_type}, ENGINE={config.engine})")
    with progress:
        end, run_dir = await run_foreground(config, run_id, observe, started)
    if isinstance(end.data, RunSucceeded):
        _figures(console, end.data.summary)
    console.print(f"results: [bold]{run_dir}[/]")
    return end.name


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
    console.print(f"summary: {summary.get('summary_csv')}", highlight=False)
