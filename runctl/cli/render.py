"""How the CLI shows events, runs and config problems."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from runctl.errors import ConfigError
from runctl.events import (
    CheckpointSaved,
    ClusterReady,
    ConfigRejected,
    ConfigSubmitted,
    ConfigValidated,
    Event,
    PhaseStarted,
    PluginFailed,
    ReplicasReady,
    RunAdmitted,
    RunCancelled,
    RunFailed,
    RunQueued,
    RunSucceeded,
    StepDone,
    TrialFinished,
)
from runctl.events.payloads import Payload

STATE_STYLE = {
    "succeeded": "green",
    "failed": "red",
    "rejected": "red",
    "cancelled": "yellow",
    "running": "cyan",
    "starting": "cyan",
}


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def describe(data: Payload) -> str:  # noqa: C901 — one branch per event type reads best as a flat list
    """One line saying what an event means."""
    if isinstance(data, ConfigSubmitted):
        return f"{data.run_type} run, engine {data.engine}, by {data.submitter} via {data.via}"
    if isinstance(data, ConfigValidated):
        return f"{len(data.checks)} check(s) passed"
    if isinstance(data, ConfigRejected):
        fatal = [c for c in data.checks if c.severity == "fatal"]
        return f"{data.num_fatal} fatal: " + "; ".join(c.message for c in fatal[:3])
    if isinstance(data, RunQueued):
        return f"position {data.position}: {data.reason}"
    if isinstance(data, RunAdmitted):
        granted = ", ".join(f"{k} {v:g}" for k, v in data.resources.items())
        return f"{granted} ({data.quota_decision})"
    if isinstance(data, PhaseStarted):
        return f"phase {data.phase}"
    if isinstance(data, ClusterReady):
        return f"{data.num_nodes}/{data.num_nodes_expected} nodes, {data.num_gpus:g} GPUs at {data.ray_address}"
    if isinstance(data, ReplicasReady):
        return f"{data.dp} × TP{data.tp} replicas of {data.model}: {data.health}"
    if isinstance(data, TrialFinished):
        return f"{data.task} #{data.trial}: reward {_fmt(data.reward)} ({data.termination_reason})"
    if isinstance(data, StepDone):
        keys = ("critic/score/mean", "actor/ppo_kl", "actor/entropy")
        return f"step {data.step}: " + ", ".join(f"{k} {_fmt(data.metrics.get(k))}" for k in keys)
    if isinstance(data, CheckpointSaved):
        return f"step {data.step} → {data.path} ({data.format})"
    if isinstance(data, PluginFailed):
        step = "" if data.step is None else f" at step {data.step}"
        return f"runctl's {data.plugin}{step}: {data.error_type}: {data.message}"
    if isinstance(data, RunSucceeded):
        return f"score {_fmt(data.score)}; " + ", ".join(f"{k} {v}" for k, v in data.summary.items())
    if isinstance(data, RunFailed):
        return f"in phase {data.phase}: {data.error_type}: {data.message}"
    if isinstance(data, RunCancelled):
        return f"by {data.requested_by} during {data.phase}"
    return ", ".join(f"{k}={v}" for k, v in data.model_dump().items())


def event_line(event: Event) -> str:
    """``12:00:01.234  step.done  step 3: … [synthetic]`` with Rich markup."""
    tag = " [magenta]\\[synthetic][/]" if getattr(event.data, "synthetic", False) else ""
    when = event.time.astimezone().strftime("%H:%M:%S.%f")[:-3]
    failed = event.name in ("run.failed", "config.rejected", "plugin.failed")
    style = "red" if failed else "bold" if event.name.startswith("run.") else ""
    name = f"[{style}]{event.name:<17}[/]" if style else f"{event.name:<17}"
    return f"[dim]{when}[/]  {name} {_escape(describe(event.data))}{tag}"


def _escape(text: str) -> str:
    return text.replace("[", "\\[")


def print_config_error(console: Console, error: ConfigError) -> None:
    for issue in error.issues:
        where = issue.path if issue.line is None else f"{issue.path}:{issue.line}"
        console.print(f"[red]✗[/] [bold]{_escape(where)}[/] [dim]({issue.code})[/] {_escape(issue.message)}")
        if issue.fix:
            console.print(f"    [dim]fix:[/] {_escape(issue.fix)}")
    count = len(error.issues)
    console.print(f"[red]{count} fatal problem{'s' if count != 1 else ''}[/]; nothing was launched.")


def runs_table(runs: list[dict[str, Any]]) -> Table:
    table = Table(box=None, pad_edge=False)
    for column in ("run", "team", "type", "state", "phase", "step", "trials", "score", "submitted"):
        table.add_column(column)
    for run in runs:
        state = run.get("state") or "?"
        synthetic = " (synthetic)" if run.get("synthetic") else ""
        table.add_row(
            run["run_id"],
            run.get("team") or "",
            run.get("run_type") or "",
            f"[{STATE_STYLE.get(state, '')}]{state}[/]" if STATE_STYLE.get(state) else state,
            run.get("phase") or "",
            "" if run.get("last_step") is None else str(run["last_step"]),
            str(run.get("num_trials") or 0),
            _fmt(run.get("score")) + synthetic,
            _short_time(run.get("submitted_at")),
        )
    return table


def _short_time(iso: str | None) -> str:
    if not iso:
        return ""
    return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def usage_table(rows: list[dict[str, Any]], first: str) -> Table:
    """Usage rows (per team or per run, ``first`` naming the row) as `runctl usage` prints them."""
    table = Table(box=None, pad_edge=False)
    for column in (first, "GPU-h rollout", "GPU-h training", "GPU-h eval", "CPU-h", "sandbox-min", "tokens"):
        table.add_column(column, justify="left" if column == first else "right")
    for row in rows:
        gpu = row["gpu_hours"]
        table.add_row(
            row[first],
            *(f"{gpu[role]:.2f}" for role in ("rollout", "training", "eval")),
            f"{row['cpu_hours']:.2f}",
            f"{row['sandbox_minutes']:.1f}",
            f"{row['tokens_generated']:,}",
        )
    return table
