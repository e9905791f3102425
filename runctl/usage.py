"""What each run and each team used, derived from the events alone (so it is the same wherever it is computed, and
any time again from the event log).

- **GPU-hours by role**: a run holds the GPUs its ``run.admitted`` granted from then until its end event (or until
  ``now`` while it runs). An infer run's are ``rollout`` (generating rollouts for the difficulty filter), an eval
  run's ``eval``, a train run's ``training`` — except the rollout nodes of a fully async train run, granted apart
  as ``rollout_gpus``, which are ``rollout``.
- **CPU-hours**: the same for the CPUs a CPU run (no GPUs) was granted.
- **Sandbox-minutes**: from each ``sandbox.created`` to its ``sandbox.destroyed`` (or the run's end, or ``now``).
- **Tokens generated**: the completion tokens its trials report (``trial.finished``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from runctl.events import (
    ConfigSubmitted,
    Event,
    RunAdmitted,
    RunCancelled,
    RunFailed,
    RunSucceeded,
    SandboxCreated,
    SandboxDestroyed,
    TrialFinished,
)

ROLES = ("rollout", "training", "eval")
_ROLE_OF = {"infer": "rollout", "train": "training", "eval": "eval"}
ENDS = (RunSucceeded, RunFailed, RunCancelled)


@dataclass
class Usage:
    gpu_hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ROLES, 0.0))
    cpu_hours: float = 0.0
    sandbox_minutes: float = 0.0
    tokens_generated: int = 0

    def add(self, other: Usage) -> None:
        for role in ROLES:
            self.gpu_hours[role] += other.gpu_hours[role]
        self.cpu_hours += other.cpu_hours
        self.sandbox_minutes += other.sandbox_minutes
        self.tokens_generated += other.tokens_generated

    def any(self) -> bool:
        """True when anything was used."""
        return bool(sum(self.gpu_hours.values()) or self.cpu_hours or self.sandbox_minutes or self.tokens_generated)

    def as_dict(self) -> dict[str, object]:
        return {
            "gpu_hours": {role: round(hours, 6) for role, hours in self.gpu_hours.items()},
            "cpu_hours": round(self.cpu_hours, 6),
            "sandbox_minutes": round(self.sandbox_minutes, 6),
            "tokens_generated": self.tokens_generated,
        }


@dataclass
class _Run:
    team: str
    run_type: str = ""
    admitted: RunAdmitted | None = None
    admitted_at: datetime | None = None
    ended_at: datetime | None = None
    sandboxes: dict[str, datetime] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)


def _hours(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds() / 3600)


def usage_by_run(
    events: Iterable[Event],
    now: datetime,
    since: datetime | None = None,
    run_types: Mapping[str, str] | None = None,
) -> dict[str, tuple[str, Usage]]:
    """Run id → (team, what it used), counting only time after ``since`` when given (and before ``now``).

    ``run_types`` gives the type of runs whose ``config.submitted`` is not among ``events`` (a reader that keeps the
    type apart need not load every submitted config)."""
    runs: dict[str, _Run] = {}

    def clip(start: datetime, end: datetime) -> tuple[datetime, datetime]:
        start = max(start, since) if since is not None else start
        return start, min(end, now)

    for event in sorted(events, key=lambda e: e.time):
        run = runs.setdefault(event.runid, _Run(event.team, (run_types or {}).get(event.runid, "")))
        data = event.data
        if isinstance(data, ConfigSubmitted):
            run.run_type = data.run_type
        elif isinstance(data, RunAdmitted):
            run.admitted, run.admitted_at = data, event.time
        elif isinstance(data, ENDS) and run.ended_at is None:
            run.ended_at = event.time
        elif isinstance(data, SandboxCreated):
            run.sandboxes[data.sandbox_id] = event.time
        elif isinstance(data, SandboxDestroyed) and data.sandbox_id in run.sandboxes:
            start, end = clip(run.sandboxes.pop(data.sandbox_id), event.time)
            run.usage.sandbox_minutes += max(0.0, (end - start).total_seconds() / 60)
        elif isinstance(data, TrialFinished) and (since is None or event.time >= since) and event.time <= now:
            run.usage.tokens_generated += int(data.tokens.get("completion", 0))
    for run in runs.values():
        end = run.ended_at or now
        for started in run.sandboxes.values():  # never destroyed: held until the run's end
            start, stop = clip(started, end)
            run.usage.sandbox_minutes += max(0.0, (stop - start).total_seconds() / 60)
        if run.admitted is None or run.admitted_at is None:
            continue
        start, stop = clip(run.admitted_at, end)
        hours = _hours(start, stop)
        granted = run.admitted.resources
        gpus = float(granted.get("gpus", 0.0))
        rollout = float(granted.get("rollout_gpus", 0.0)) if run.run_type == "train" else 0.0
        role = _ROLE_OF.get(run.run_type, "training")
        run.usage.gpu_hours[role] += (gpus - rollout) * hours
        run.usage.gpu_hours["rollout"] += rollout * hours
        if gpus == 0:
            run.usage.cpu_hours += float(granted.get("cpus", 0.0)) * hours
    return {run_id: (run.team, run.usage) for run_id, run in runs.items()}


def usage_by_team(per_run: dict[str, tuple[str, Usage]]) -> dict[str, Usage]:
    teams: dict[str, Usage] = {}
    for team, usage in per_run.values():
        teams.setdefault(team, Usage()).add(usage)
    return teams
