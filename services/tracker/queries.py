"""What the run pages ask of the database: metrics downsampled in SQL, the lifecycle timeline, the validation
report, checkpoints joined with their eval runs, pass rates per task."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from services.tracker.db import (
    CheckpointRow,
    EventRow,
    MetricRow,
    RunRow,
    TaskStatsRow,
    TokenUsageRow,
    TrialRow,
    aware,
    hour_of,
    iso,
)

DEFAULT_KEYS = ("critic/score/mean", "actor/ppo_kl", "actor/entropy", "response_length/mean", "perf/mfu/actor")
# Lifecycle events that mark the timeline under these names (phases, steps and checkpoints are named below).
MARKS = {
    "config.submitted": "submitted",
    "config.validated": "validated",
    "config.rejected": "rejected",
    "run.queued": "queued",
    "run.admitted": "admitted",
    "cluster.ready": "cluster.ready",
    "replicas.ready": "replicas.ready",
    "eval.requested": "eval.requested",
    "run.succeeded": "succeeded",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
}


def metric_keys(session: Session, run_id: str) -> list[str]:
    return list(session.scalars(select(MetricRow.key).where(MetricRow.run_id == run_id).distinct().order_by("key")))


def metrics(session: Session, run_id: str, keys: list[str], max_points: int) -> dict[str, Any]:
    """Each key's series, at most ``max_points`` points: the run's steps split into equal buckets, each drawn at
    its last step with the bucket's mean, min and max (a spike stays visible in the band). One grouped query for
    all the keys."""
    last = session.scalar(select(RunRow.last_step).where(RunRow.run_id == run_id))
    if last is None:  # no step.done stored yet
        return {"run_id": run_id, "num_steps": 0, "downsampled": False, "series": {}}
    width = max(1, math.ceil((last + 1) / max_points))
    bucket = MetricRow.step // width
    rows = session.execute(
        select(
            MetricRow.key,
            func.max(MetricRow.step),
            func.avg(MetricRow.value),
            func.min(MetricRow.value),
            func.max(MetricRow.value),
            func.count(),
        )
        .where(MetricRow.run_id == run_id, MetricRow.key.in_(keys))
        .group_by(MetricRow.key, bucket)
        .order_by(MetricRow.key, bucket)
    ).all()
    series: dict[str, dict[str, list[Any]]] = {}
    num_steps: dict[str, int] = {}
    for key, step, mean, low, high, count in rows:
        entry = series.setdefault(key, {"steps": [], "values": [], "min": [], "max": []})
        entry["steps"].append(step)
        entry["values"].append(_num(mean))
        entry["min"].append(_num(low))
        entry["max"].append(_num(high))
        num_steps[key] = num_steps.get(key, 0) + count
    most = max(num_steps.values(), default=0)
    return {"run_id": run_id, "num_steps": most, "downsampled": width > 1 and most > max_points, "series": series}


def _num(value: Any) -> float | None:
    return None if value is None else round(float(value), 9)


def timeline(session: Session, run_id: str) -> list[dict[str, Any]]:
    """The run's lifecycle marks in order, with the time since the first and since the previous one. Steps show as
    the first and the last; trials are left out (the trial browser has them)."""
    rows = session.execute(
        select(EventRow.name, EventRow.time, EventRow.data)
        .where(EventRow.run_id == run_id, EventRow.name.in_([*MARKS, "phase.started", "checkpoint.saved"]))
        .order_by(EventRow.time, EventRow.pk)
    ).all()
    marks: list[tuple[str, datetime, str]] = []
    for name, time, data in rows:
        if name == "phase.started":
            marks.append((f"phase:{data['phase']}", time, ""))
        elif name == "checkpoint.saved":
            marks.append((f"checkpoint {data['step']}", time, str(data.get("path", ""))))
        elif name in MARKS:
            marks.append((MARKS[name], time, _detail(name, data)))
    steps = select(EventRow.time, EventRow.data).where(EventRow.run_id == run_id, EventRow.name == "step.done")
    first = session.execute(steps.order_by(EventRow.time, EventRow.pk).limit(1)).first()
    last = session.execute(steps.order_by(EventRow.time.desc(), EventRow.pk.desc()).limit(1)).first()
    ends = [row for row in (first, last) if row is not None]
    if len(ends) == 2 and ends[0].data["step"] == ends[1].data["step"]:
        ends = ends[:1]
    marks += [(f"step {row.data['step']}", row.time, "") for row in ends]
    marks.sort(key=lambda m: aware(m[1]))
    out: list[dict[str, Any]] = []
    start = aware(marks[0][1]) if marks else None
    previous: datetime | None = None
    for name, time, detail in marks:
        moment = aware(time)
        out.append(
            {
                "name": name,
                "time": iso(moment),
                "since_start_s": round((moment - start).total_seconds(), 3) if start else 0.0,
                "since_prev_s": round((moment - previous).total_seconds(), 3) if previous else None,
                "detail": detail,
            }
        )
        previous = moment
    return out


def _detail(name: str, data: dict[str, Any]) -> str:
    if name == "config.submitted":
        return f"{data.get('via')}:{data.get('submitter')}"
    if name == "run.queued":
        return f"position {data.get('position')}: {data.get('reason')}"
    if name == "run.admitted":
        return str(data.get("quota_decision", ""))
    if name == "cluster.ready":
        return f"{data.get('num_nodes')} node(s), {data.get('num_gpus')} GPU, {data.get('num_cpus')} CPU"
    if name == "replicas.ready":
        return f"{data.get('dp')} × TP {data.get('tp')}: {data.get('model')}"
    if name == "run.failed":
        return f"{data.get('phase')}: {data.get('error_type')}: {data.get('message')}"
    if name == "run.cancelled":
        return f"by {data.get('requested_by')}"
    if name == "eval.requested":
        return f"step {data.get('checkpoint_step')} → {data.get('eval_run_id')}"
    if name == "run.succeeded" and data.get("score") is not None:
        return f"score {data['score']:.3f}"
    return ""


def validation(session: Session, run_id: str) -> dict[str, Any]:
    """The latest validation report of the run (the validator's verdict and every check)."""
    row = session.execute(
        select(EventRow.name, EventRow.data)
        .where(EventRow.run_id == run_id, EventRow.name.in_(("config.validated", "config.rejected")))
        .order_by(EventRow.time.desc(), EventRow.pk.desc())
        .limit(1)
    ).first()
    if row is None:
        return {"verdict": None, "checks": []}
    verdict = "validated" if row.name == "config.validated" else "rejected"
    return {"verdict": verdict, "checks": row.data.get("checks", [])}


def checkpoints(session: Session, run_id: str) -> list[dict[str, Any]]:
    """The run's checkpoints by step, each with its eval run's state and score when one was requested."""
    rows = session.execute(
        select(CheckpointRow, RunRow.state, RunRow.score)
        .outerjoin(RunRow, RunRow.run_id == CheckpointRow.eval_run_id)
        .where(CheckpointRow.run_id == run_id)
        .order_by(CheckpointRow.step)
    ).all()
    return [
        {
            "step": c.step,
            "path": c.path,
            "format": c.format,
            "num_bytes": c.num_bytes,
            "time": iso(c.time),
            "eval_run_id": c.eval_run_id,
            "eval_state": state,
            "eval_score": score,
        }
        for c, state, score in rows
    ]


def _rate(stats: TaskStatsRow) -> dict[str, Any]:
    return {
        "num_trials": stats.num_trials,
        "passes": stats.passes,
        "pass_rate": round(stats.passes / stats.num_scored, 6) if stats.num_scored else None,
        "mean_reward": round(stats.reward_sum / stats.num_scored, 9) if stats.num_scored else None,
    }


def task_rates(session: Session, run_id: str) -> list[dict[str, Any]]:
    rows = session.scalars(select(TaskStatsRow).where(TaskStatsRow.run_id == run_id).order_by(TaskStatsRow.task))
    return [{"task": row.task, **_rate(row)} for row in rows]


def pass_rates_across(session: Session, run_ids: list[str], task: str | None) -> list[dict[str, Any]]:
    """Pass rate of each task in each of the runs (the same held-out task over checkpoints, say)."""
    query = select(TaskStatsRow).where(TaskStatsRow.run_id.in_(run_ids))
    if task is not None:
        query = query.where(TaskStatsRow.task == task)
    tasks: dict[str, dict[str, Any]] = {}
    for row in session.scalars(query.order_by(TaskStatsRow.task, TaskStatsRow.run_id)):
        tasks.setdefault(row.task, {})[row.run_id] = _rate(row)
    return [{"task": name, "runs": runs} for name, runs in tasks.items()]


# What usage is derived from (runctl.usage), besides the generated tokens kept per hour (token_usage); the run's type
# is read from its row, not from its submitted config.
USAGE_EVENTS = (
    "run.admitted",
    "run.succeeded",
    "run.failed",
    "run.cancelled",
    "sandbox.created",
    "sandbox.destroyed",
)
HOUR = timedelta(hours=1)


def usage(session: Session, team: str | None, since: datetime | None, now: datetime) -> dict[str, Any]:
    """GPU-hours by role, CPU-hours, sandbox-minutes and tokens, per team and per run (those that used anything),
    from the stored events; only what was used after ``since`` counts when it is given.

    Time held comes from the few events that start and end it (admission, end, sandboxes); tokens from the hourly
    sums (:func:`tokens_by_run`), so a window reads no trial it does not cut through."""
    from runctl.events import parse_event
    from runctl.usage import Usage, usage_by_run, usage_by_team

    query = select(EventRow).where(EventRow.name.in_(USAGE_EVENTS))
    if team is not None:
        query = query.where(EventRow.team == team)
    rows = session.scalars(query).all()
    tokens = tokens_by_run(session, team, since, now)
    run_ids = {row.run_id for row in rows} | set(tokens)
    found = session.execute(select(RunRow.run_id, RunRow.run_type).where(RunRow.run_id.in_(run_ids)))
    types: dict[str, str | None] = {run_id: run_type for run_id, run_type in found}
    events = [
        parse_event(
            {
                "id": row.id,
                "source": row.source,
                "type": row.type,
                "time": aware(row.time),
                "subject": row.run_id,
                "team": row.team,
                "runid": row.run_id,
                "data": row.data,
            }
        )  # fmt: skip
        for row in rows
    ]
    per_run = usage_by_run(events, now, since, {k: v for k, v in types.items() if v})
    for run_id, (owner, generated) in tokens.items():
        per_run.setdefault(run_id, (owner, Usage()))[1].tokens_generated += generated
    used = {run_id: found for run_id, found in per_run.items() if found[1].any()}
    return {
        "now": now.isoformat(),
        "since": since.isoformat() if since is not None else None,
        "teams": [{"team": t, **u.as_dict()} for t, u in sorted(usage_by_team(used).items())],
        "runs": [
            {"run_id": run_id, "team": t, "run_type": types.get(run_id), **u.as_dict()}
            for run_id, (t, u) in sorted(used.items())
        ],
    }


def tokens_by_run(
    session: Session, team: str | None, since: datetime | None, now: datetime
) -> dict[str, tuple[str, int]]:
    """Run id → (team, completion tokens of its trials that ended in [since, now]): the hours wholly inside the
    window from their sums, the (at most two) hours it cuts through from their trials."""
    last = hour_of(now)
    whole: Any = TokenUsageRow.hour < last  # hours that ended before now
    cuts: list[tuple[datetime, datetime | None]] = [(last, None)]  # [start, end), None: up to now
    if since is not None:
        first = hour_of(since) if since == hour_of(since) else hour_of(since) + HOUR
        if first <= last:
            whole &= TokenUsageRow.hour >= first
            cuts = [(since, first), (last, None)]
        else:  # the window lies inside one hour
            whole = None
            cuts = [(since, None)]
    found: dict[str, tuple[str, int]] = {}

    def add(run_id: str, owner: str, generated: int) -> None:
        found[run_id] = (owner, found.get(run_id, (owner, 0))[1] + generated)

    if whole is not None:
        query = select(TokenUsageRow.run_id, TokenUsageRow.team, func.sum(TokenUsageRow.tokens_generated))
        query = query.where(whole) if team is None else query.where(whole, TokenUsageRow.team == team)
        for run_id, owner, generated in session.execute(query.group_by(TokenUsageRow.run_id, TokenUsageRow.team)):
            add(run_id, owner, int(generated or 0))
    for start, end in cuts:
        trials = select(TrialRow.run_id, RunRow.team, TrialRow.tokens).join(RunRow, RunRow.run_id == TrialRow.run_id)
        trials = trials.where(TrialRow.time >= start, TrialRow.time < end if end is not None else TrialRow.time <= now)
        if team is not None:
            trials = trials.where(RunRow.team == team)
        for run_id, owner, spent in session.execute(trials):
            add(run_id, owner, int((spent or {}).get("completion", 0)))
    return found
